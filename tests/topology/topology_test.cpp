#include <weft/topology/topology.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

namespace weft::topology {
// Failures print a cluster as its spec, and a link as a spec's link.
void PrintTo(const cluster& c, std::ostream* os) { *os << c.to_string(); }
void PrintTo(link_kind k, std::ostream* os) { *os << name_of(k); }
void PrintTo(const link& l, std::ostream* os) {
  *os << name_of(l.kind) << ":" << l.bandwidth << "B/s:" << l.latency << "s";
}
} // namespace weft::topology

namespace {

using ::testing::HasSubstr;
using weft::topology::cluster;
using weft::topology::link;
using weft::topology::link_kind;
using weft::topology::parse;

// The message parse() throws for `spec`, or a note that it threw nothing.
std::string parse_error(const std::string& spec) {
  try {
    (void)parse(spec);
  } catch (const weft::error& e) {
    return e.what();
  }
  return "<parse(\"" + spec + "\") did not throw>";
}

// A link of this kind and these figures, each within 4 ulps (as EXPECT_DOUBLE_EQ).
::testing::Matcher<const link&> is_link(const link& want) {
  using ::testing::DoubleEq;
  using ::testing::Field;
  return ::testing::AllOf(Field("kind", &link::kind, want.kind),
                          Field("bandwidth", &link::bandwidth, DoubleEq(want.bandwidth)),
                          Field("latency", &link::latency, DoubleEq(want.latency)));
}

// A cluster whose links within and between nodes are these (as is_link).
::testing::Matcher<const cluster&> has_links(const link& intra, const link& inter) {
  return ::testing::AllOf(::testing::Property("intra", &cluster::intra, is_link(intra)),
                          ::testing::Property("inter", &cluster::inter, is_link(inter)));
}

// Rank r of c is on node node[r], as its local rank local[r], for every rank of c.
void expect_numbering(const cluster& c, const std::vector<int>& node,
                      const std::vector<int>& local) {
  SCOPED_TRACE(c.to_string());
  ASSERT_EQ(static_cast<std::size_t>(c.size()), node.size());
  ASSERT_EQ(local.size(), node.size());
  for (int r = 0; r < c.size(); ++r) {
    EXPECT_EQ(c.node_of(r), node[static_cast<std::size_t>(r)]) << "rank " << r;
    EXPECT_EQ(c.local_rank(r), local[static_cast<std::size_t>(r)]) << "rank " << r;
  }
}

// A bad spec throws weft::error that quotes the whole spec and the offending token.
void expect_rejected(const std::string& spec, const std::string& token) {
  SCOPED_TRACE(spec);
  const std::string message = parse_error(spec);
  EXPECT_THAT(message, HasSubstr("weft: topology spec \"" + spec + "\": "));
  EXPECT_THAT(message, HasSubstr("\"" + token + "\""));
}

// ---------------------------------------------------------------------------------------
// link kinds

static_assert(weft::topology::name_of(link_kind::nvlink) == "nvlink");
static_assert(weft::topology::name_of(link_kind::pcie) == "pcie");
static_assert(weft::topology::name_of(link_kind::shm) == "shm");
static_assert(weft::topology::name_of(link_kind::infiniband) == "ib");
static_assert(weft::topology::name_of(link_kind::ethernet) == "ethernet");
static_assert(weft::topology::is_intra_node(link_kind::nvlink));
static_assert(weft::topology::is_intra_node(link_kind::pcie));
static_assert(weft::topology::is_intra_node(link_kind::shm));
static_assert(!weft::topology::is_intra_node(link_kind::infiniband));
static_assert(!weft::topology::is_intra_node(link_kind::ethernet));

TEST(LinkKind, NamesReadBack) {
  for (const auto k : {link_kind::nvlink, link_kind::pcie, link_kind::shm, link_kind::infiniband,
                       link_kind::ethernet}) {
    EXPECT_EQ(weft::topology::kind_named(weft::topology::name_of(k)), k);
  }
  EXPECT_EQ(weft::topology::kind_named("infiniband"), link_kind::infiniband);
  EXPECT_EQ(weft::topology::kind_named("eth"), link_kind::ethernet);
  EXPECT_EQ(weft::topology::kind_named("net"), link_kind::ethernet);
  EXPECT_EQ(weft::topology::kind_named("NVLink"), link_kind::nvlink);
  EXPECT_FALSE(weft::topology::kind_named("warp").has_value());
}

TEST(LinkKind, Defaults) {
  using weft::topology::default_link;
  EXPECT_DOUBLE_EQ(default_link(link_kind::shm).bandwidth, 10e9);
  EXPECT_DOUBLE_EQ(default_link(link_kind::shm).latency, 1e-6);
  EXPECT_DOUBLE_EQ(default_link(link_kind::ethernet).bandwidth, 1.25e9);
  EXPECT_DOUBLE_EQ(default_link(link_kind::ethernet).latency, 20e-6);
  EXPECT_DOUBLE_EQ(default_link(link_kind::nvlink).bandwidth, 450e9);
  EXPECT_DOUBLE_EQ(default_link(link_kind::nvlink).latency, 2e-6);
  EXPECT_DOUBLE_EQ(default_link(link_kind::pcie).bandwidth, 25e9);
  EXPECT_DOUBLE_EQ(default_link(link_kind::pcie).latency, 3e-6);
  EXPECT_DOUBLE_EQ(default_link(link_kind::infiniband).bandwidth, 50e9);
  EXPECT_DOUBLE_EQ(default_link(link_kind::infiniband).latency, 5e-6);
  for (const auto k : {link_kind::nvlink, link_kind::pcie, link_kind::shm, link_kind::infiniband,
                       link_kind::ethernet}) {
    EXPECT_EQ(default_link(k).kind, k);
  }
}

// ---------------------------------------------------------------------------------------
// cluster

TEST(Cluster, DefaultIsOneDeviceOverShm) {
  const cluster c;
  EXPECT_EQ(c.nodes(), 1);
  EXPECT_EQ(c.size(), 1);
  EXPECT_EQ(c.devices_on(0), 1);
  EXPECT_TRUE(c.uniform());
  EXPECT_THAT(c, has_links({link_kind::shm, 10e9, 1e-6}, {link_kind::ethernet, 1.25e9, 20e-6}));
  EXPECT_EQ(c.nics_per_node(), 1);
  EXPECT_DOUBLE_EQ(c.reduce_bandwidth(), 10e9);
}

TEST(Cluster, UnevenRankNumbering) {
  const cluster c({3, 5}, link{link_kind::nvlink, 300e9, 2e-6},
                  link{link_kind::infiniband, 25e9, 5e-6}, 2, 1e12);
  EXPECT_EQ(c.nodes(), 2);
  EXPECT_EQ(c.size(), 8);
  EXPECT_FALSE(c.uniform());
  EXPECT_EQ(c.devices_on(0), 3);
  EXPECT_EQ(c.devices_on(1), 5);
  EXPECT_EQ(c.first_rank(0), 0);
  EXPECT_EQ(c.first_rank(1), 3);
  EXPECT_EQ(c.first_rank(2), 8);
  expect_numbering(c, {0, 0, 0, 1, 1, 1, 1, 1}, {0, 1, 2, 0, 1, 2, 3, 4});
  EXPECT_EQ(c.nics_per_node(), 2);
  EXPECT_DOUBLE_EQ(c.reduce_bandwidth(), 1e12);
}

TEST(Cluster, ThreeUnevenNodes) {
  const cluster c = parse("1+4+2");
  ASSERT_EQ(c.size(), 7);
  expect_numbering(c, {0, 1, 1, 1, 1, 2, 2}, {0, 0, 1, 2, 3, 0, 1});
  EXPECT_EQ(c.first_rank(0), 0);
  EXPECT_EQ(c.first_rank(1), 1);
  EXPECT_EQ(c.first_rank(2), 5);
  EXPECT_EQ(c.first_rank(3), 7);
}

TEST(Cluster, UniformRankNumbering) {
  const cluster c = parse("3x4");
  for (int r = 0; r < 12; ++r) {
    EXPECT_EQ(c.node_of(r), r / 4);
    EXPECT_EQ(c.local_rank(r), r % 4);
  }
  EXPECT_EQ(c.first_rank(2), 8);
  EXPECT_TRUE(c.uniform());
}

TEST(Cluster, LinkBetween) {
  const cluster c({3, 5}, link{link_kind::nvlink, 300e9, 2e-6},
                  link{link_kind::infiniband, 25e9, 5e-6});
  EXPECT_EQ(&c.link_between(0, 2), &c.intra());
  EXPECT_EQ(&c.link_between(3, 7), &c.intra());
  EXPECT_EQ(&c.link_between(4, 4), &c.intra());
  EXPECT_EQ(&c.link_between(2, 3), &c.inter());
  EXPECT_EQ(&c.link_between(7, 0), &c.inter());
  EXPECT_EQ(c.link_between(2, 3).kind, link_kind::infiniband);
}

TEST(Cluster, OutOfRangeThrows) {
  const cluster c = parse("3+5");
  EXPECT_THROW((void)c.node_of(8), weft::error);
  EXPECT_THROW((void)c.node_of(-1), weft::error);
  EXPECT_THROW((void)c.local_rank(8), weft::error);
  EXPECT_THROW((void)c.devices_on(2), weft::error);
  EXPECT_THROW((void)c.first_rank(3), weft::error);
  EXPECT_THROW((void)c.link_between(0, 8), weft::error);
}

TEST(Cluster, ConstructorValidates) {
  const link shm{link_kind::shm, 10e9, 1e-6};
  const link eth{link_kind::ethernet, 1e9, 1e-5};
  EXPECT_THROW(cluster({}, shm, eth), weft::error);
  EXPECT_THROW(cluster({4, 0}, shm, eth), weft::error);
  EXPECT_THROW(cluster({-1}, shm, eth), weft::error);
  EXPECT_THROW(cluster({2}, link{link_kind::shm, 0, 1e-6}, eth), weft::error);
  EXPECT_THROW(cluster({2}, link{link_kind::shm, -5, 1e-6}, eth), weft::error);
  EXPECT_THROW(cluster({2}, shm, link{link_kind::ethernet, 0, 1e-6}), weft::error);
  EXPECT_THROW(cluster({2}, link{link_kind::shm, 1e9, -1e-6}, eth), weft::error);
  EXPECT_THROW(cluster({2}, shm, link{link_kind::ethernet, 1e9, -1e-9}), weft::error);
  EXPECT_THROW(cluster({2}, link{link_kind::shm, std::numeric_limits<double>::infinity(), 0}, eth),
               weft::error);
  EXPECT_THROW(cluster({2}, link{link_kind::shm, std::numeric_limits<double>::quiet_NaN(), 0}, eth),
               weft::error);
  EXPECT_THROW(cluster({2}, shm, eth, 0), weft::error);
  EXPECT_THROW(cluster({2}, shm, eth, 1, 0.0), weft::error);
  EXPECT_THROW(cluster({2}, link{link_kind::infiniband, 1e9, 0}, eth), weft::error);
  EXPECT_THROW(cluster({2}, shm, link{link_kind::nvlink, 1e9, 0}), weft::error);
  EXPECT_THROW(cluster({std::numeric_limits<int>::max(), 1}, shm, eth), weft::error);
  EXPECT_NO_THROW(cluster({2}, link{link_kind::pcie, 1e9, 0}, eth)); // zero latency is fine
}

TEST(Cluster, Equality) {
  EXPECT_EQ(parse("2x4"), parse("4+4"));
  EXPECT_EQ(parse("1x8"), parse("8"));
  EXPECT_EQ(parse("8"), weft::topology::host(8));
  EXPECT_NE(parse("2x4"), parse("3+5"));
  EXPECT_NE(parse("2x4"), parse("2x4,nics=2"));
  EXPECT_NE(parse("2x4"), parse("2x4,reduce=11GB/s"));
  EXPECT_NE(parse("2x4"), parse("2x4,shm=2us"));
  EXPECT_NE(parse("2x4"), parse("2x4,intra=pcie:10GB/s:1us")); // kind alone differs
}

// ---------------------------------------------------------------------------------------
// parse: shapes and options

TEST(Parse, FullSpec) {
  const cluster c = parse("2x4,intra=nvlink:900GB/s:2us,inter=ib:400Gb/s:5us");
  EXPECT_EQ(c.nodes(), 2);
  EXPECT_EQ(c.size(), 8);
  EXPECT_EQ(c.devices_on(1), 4);
  EXPECT_THAT(c, has_links({link_kind::nvlink, 900e9, 2e-6}, {link_kind::infiniband, 50e9, 5e-6}));
  EXPECT_EQ(c.nics_per_node(), 1);
  EXPECT_DOUBLE_EQ(c.reduce_bandwidth(), 10e9);
}

TEST(Parse, PlainCountIsOneNode) {
  const cluster c = parse("8");
  EXPECT_EQ(c.nodes(), 1);
  EXPECT_EQ(c.size(), 8);
  EXPECT_THAT(c, has_links({link_kind::shm, 10e9, 1e-6}, {link_kind::ethernet, 1.25e9, 20e-6}));
}

TEST(Parse, UnevenShape) {
  const cluster c = parse("3+5");
  EXPECT_EQ(c.nodes(), 2);
  EXPECT_EQ(c.size(), 8);
  EXPECT_EQ(c.devices_on(0), 3);
  EXPECT_EQ(c.devices_on(1), 5);
  expect_numbering(c, {0, 0, 0, 1, 1, 1, 1, 1}, {0, 1, 2, 0, 1, 2, 3, 4});
  EXPECT_EQ(c.first_rank(0), 0);
  EXPECT_EQ(c.first_rank(1), 3);
}

TEST(Parse, DesignExample) {
  const cluster c = parse("2x4,shm=20GB/s:1us,net=2GB/s:20us");
  EXPECT_EQ(c.size(), 8);
  EXPECT_THAT(c, has_links({link_kind::shm, 20e9, 1e-6}, {link_kind::ethernet, 2e9, 20e-6}));
}

TEST(Parse, ShorthandForEveryKind) {
  struct row {
    const char* spec;
    bool intra;
    link_kind kind;
    double bandwidth;
    double latency;
  };
  const row rows[] = {
      {"2x2,nvlink=600GB/s:3us", true, link_kind::nvlink, 600e9, 3e-6},
      {"2x2,pcie=32GB/s:4us", true, link_kind::pcie, 32e9, 4e-6},
      {"2x2,shm=20GB/s:1us", true, link_kind::shm, 20e9, 1e-6},
      {"2x2,ib=200Gb/s:6us", false, link_kind::infiniband, 25e9, 6e-6},
      {"2x2,infiniband=100Gb/s:7us", false, link_kind::infiniband, 12.5e9, 7e-6},
      {"2x2,ethernet=100Gb/s:10us", false, link_kind::ethernet, 12.5e9, 10e-6},
      {"2x2,eth=25Gb/s:15us", false, link_kind::ethernet, 3.125e9, 15e-6},
      {"2x2,net=2GB/s:20us", false, link_kind::ethernet, 2e9, 20e-6},
  };
  for (const row& r : rows) {
    SCOPED_TRACE(r.spec);
    const cluster c = parse(r.spec);
    const link& l = r.intra ? c.intra() : c.inter();
    EXPECT_EQ(l.kind, r.kind);
    EXPECT_DOUBLE_EQ(l.bandwidth, r.bandwidth);
    EXPECT_DOUBLE_EQ(l.latency, r.latency);
    // The other class keeps its default.
    const link& other = r.intra ? c.inter() : c.intra();
    EXPECT_EQ(other.kind, r.intra ? link_kind::ethernet : link_kind::shm);
  }
}

TEST(Parse, ExplicitClassForEveryKind) {
  EXPECT_EQ(parse("2,intra=pcie:16GB/s:3us").intra(), (link{link_kind::pcie, 16e9, 3e-6}));
  EXPECT_EQ(parse("2,intra=shm:5GB/s:2us").intra(), (link{link_kind::shm, 5e9, 2e-6}));
  EXPECT_EQ(parse("2,inter=infiniband:25GB/s:4us").inter(),
            (link{link_kind::infiniband, 25e9, 4e-6}));
  EXPECT_EQ(parse("2,inter=ethernet:1GB/s:30us").inter(), (link{link_kind::ethernet, 1e9, 30e-6}));
  EXPECT_EQ(parse("2,inter=eth:1GB/s:30us").inter(), (link{link_kind::ethernet, 1e9, 30e-6}));
  EXPECT_EQ(parse("2,inter=net:1GB/s:30us").inter(), (link{link_kind::ethernet, 1e9, 30e-6}));
}

TEST(Parse, OmittedFieldsKeepKindDefaults) {
  // nvlink's defaults are 450 GB/s and 2 us; ib's 50 GB/s and 5 us; pcie's 25 GB/s and 3 us;
  // ethernet's 1.25 GB/s and 20 us.
  EXPECT_EQ(parse("2x2,nvlink=600GB/s").intra(), (link{link_kind::nvlink, 600e9, 2e-6}));
  EXPECT_EQ(parse("2x2,nvlink=3us").intra(), (link{link_kind::nvlink, 450e9, 3e-6}));
  EXPECT_EQ(parse("2x2,ib=3us").inter(), (link{link_kind::infiniband, 50e9, 3e-6}));
  EXPECT_EQ(parse("2x2,ib=100Gb/s").inter(), (link{link_kind::infiniband, 12.5e9, 5e-6}));
  EXPECT_EQ(parse("2x2,intra=pcie").intra(), (link{link_kind::pcie, 25e9, 3e-6}));
  EXPECT_EQ(parse("2x2,intra=nvlink:100GB/s").intra(), (link{link_kind::nvlink, 100e9, 2e-6}));
  EXPECT_EQ(parse("2x2,intra=nvlink:1.5us").intra(), (link{link_kind::nvlink, 450e9, 1.5e-6}));
  EXPECT_EQ(parse("2x2,intra=nvlink::1.5us").intra(), (link{link_kind::nvlink, 450e9, 1.5e-6}));
  EXPECT_EQ(parse("2x2,intra=nvlink:100GB/s:").intra(), (link{link_kind::nvlink, 100e9, 2e-6}));
  EXPECT_EQ(parse("2x2,inter=eth:10Gb/s").inter(), (link{link_kind::ethernet, 1.25e9, 20e-6}));
  EXPECT_EQ(parse("2x2,inter=ib").inter(), (link{link_kind::infiniband, 50e9, 5e-6}));
}

TEST(Parse, NicsAndReduce) {
  const cluster c = parse("4x8,nics=8,reduce=2TB/s");
  EXPECT_EQ(c.nics_per_node(), 8);
  EXPECT_DOUBLE_EQ(c.reduce_bandwidth(), 2e12);
  EXPECT_EQ(parse("4x8,reduce=500MB/s").reduce_bandwidth(), 500e6);
}

TEST(Parse, OptionsInAnyOrder) {
  const cluster a = parse("2x8,nics=4,reduce=3TB/s,inter=ib:50GB/s:5us,intra=nvlink:450GB/s:2us");
  const cluster b = parse("2x8,intra=nvlink:450GB/s:2us,reduce=3TB/s,ib=50GB/s:5us,nics=4");
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.nics_per_node(), 4);
  EXPECT_EQ(a.inter(), (link{link_kind::infiniband, 50e9, 5e-6}));
}

TEST(Parse, Whitespace) {
  const cluster c = parse(
      "  2 x 4 ,  intra = nvlink : 900 GB/s : 2 us , inter=ib:50GB/s:5us ,nics = 4 ,"
      " reduce = 1TB/s ");
  EXPECT_EQ(c.nodes(), 2);
  EXPECT_EQ(c.size(), 8);
  EXPECT_EQ(c.intra(), (link{link_kind::nvlink, 900e9, 2e-6}));
  EXPECT_EQ(c.inter(), (link{link_kind::infiniband, 50e9, 5e-6}));
  EXPECT_EQ(c.nics_per_node(), 4);
  EXPECT_DOUBLE_EQ(c.reduce_bandwidth(), 1e12);
  EXPECT_EQ(parse(" 3 + 5 ").devices_on(1), 5);
  EXPECT_EQ(parse("\t6\n").size(), 6);
}

TEST(Parse, KeysAndKindsIgnoreCase) {
  const cluster c = parse("2X4,INTRA=NVLink:900GB/s:2us,IB=400Gb/s:5us,Nics=2");
  EXPECT_EQ(c.size(), 8);
  EXPECT_EQ(c.intra(), (link{link_kind::nvlink, 900e9, 2e-6}));
  EXPECT_EQ(c.inter(), (link{link_kind::infiniband, 50e9, 5e-6}));
  EXPECT_EQ(c.nics_per_node(), 2);
}

// ---------------------------------------------------------------------------------------
// parse: units

double bandwidth_of(const std::string& text) { return parse("1,shm=" + text).intra().bandwidth; }
double latency_of(const std::string& text) { return parse("1,shm=1GB/s:" + text).intra().latency; }

TEST(Units, Bandwidth) {
  EXPECT_DOUBLE_EQ(bandwidth_of("1B/s"), 1.0);
  EXPECT_DOUBLE_EQ(bandwidth_of("1KB/s"), 1e3);
  EXPECT_DOUBLE_EQ(bandwidth_of("1MB/s"), 1e6);
  EXPECT_DOUBLE_EQ(bandwidth_of("1GB/s"), 1e9);
  EXPECT_DOUBLE_EQ(bandwidth_of("1TB/s"), 1e12);
  EXPECT_DOUBLE_EQ(bandwidth_of("8Kb/s"), 1e3);
  EXPECT_DOUBLE_EQ(bandwidth_of("8Mb/s"), 1e6);
  EXPECT_DOUBLE_EQ(bandwidth_of("8Gb/s"), 1e9);
  EXPECT_DOUBLE_EQ(bandwidth_of("8Tb/s"), 1e12);
  EXPECT_DOUBLE_EQ(bandwidth_of("400Gb/s"), 50e9);
  EXPECT_DOUBLE_EQ(bandwidth_of("200Gb/s"), 25e9);
  EXPECT_DOUBLE_EQ(bandwidth_of("1.6Tb/s"), 200e9);
  EXPECT_DOUBLE_EQ(bandwidth_of("10Gb/s"), 1.25e9);
  EXPECT_DOUBLE_EQ(bandwidth_of("0.5GB/s"), 0.5e9);
  EXPECT_DOUBLE_EQ(bandwidth_of("3.35TB/s"), 3.35e12);
  EXPECT_DOUBLE_EQ(bandwidth_of("1.5e3MB/s"), 1.5e9);
  EXPECT_DOUBLE_EQ(bandwidth_of("25E-1GB/s"), 2.5e9);
  EXPECT_DOUBLE_EQ(bandwidth_of("007GB/s"), 7e9);
  // Read as a decimal, so exactly the double nearest the written value.
  EXPECT_EQ(bandwidth_of("0.1GB/s"), 1e8);
  EXPECT_EQ(bandwidth_of("1.1GB/s"), 1.1e9);
}

TEST(Units, Latency) {
  EXPECT_DOUBLE_EQ(latency_of("250ns"), 250e-9);
  EXPECT_DOUBLE_EQ(latency_of("2.5us"), 2.5e-6);
  EXPECT_DOUBLE_EQ(latency_of("1ms"), 1e-3);
  EXPECT_DOUBLE_EQ(latency_of("0.02s"), 0.02);
  EXPECT_DOUBLE_EQ(latency_of("2s"), 2.0);
  EXPECT_DOUBLE_EQ(latency_of("1e3ns"), 1e-6);
  EXPECT_DOUBLE_EQ(latency_of("0us"), 0.0);
  EXPECT_EQ(latency_of("0.3us"), 0.3e-6);
}

// ---------------------------------------------------------------------------------------
// to_string round trip

TEST(ToString, PresetText) {
  EXPECT_EQ(weft::topology::dgx_h100(2).to_string(),
            "2x8,intra=nvlink:450GB/s:2us,inter=ib:50GB/s:5us,nics=8,reduce=3.35TB/s");
  EXPECT_EQ(weft::topology::dgx_a100(1).to_string(),
            "1x8,intra=nvlink:300GB/s:2us,inter=ib:25GB/s:5us,nics=8,reduce=2.039TB/s");
  EXPECT_EQ(cluster().to_string(),
            "1x1,intra=shm:10GB/s:1us,inter=ethernet:1.25GB/s:20us,nics=1,reduce=10GB/s");
  EXPECT_EQ(parse("3+5,pcie=1.5ms,eth=123B/s:0.5ns").to_string(),
            "3+5,intra=pcie:25GB/s:1.5ms,inter=ethernet:123B/s:0.5ns,nics=1,reduce=10GB/s");
  EXPECT_EQ(parse("1,shm=1234.5KB/s:0s").to_string(),
            "1x1,intra=shm:1.2345MB/s:0s,inter=ethernet:1.25GB/s:20us,nics=1,reduce=10GB/s");
  // Far from every unit, an exponent instead of a run of zeros.
  EXPECT_EQ(parse("1,shm=1e16B/s:1e-15s,reduce=5000TB/s").to_string(),
            "1x1,intra=shm:1e4TB/s:1e-6ns,inter=ethernet:1.25GB/s:20us,nics=1,reduce=5000TB/s");
  EXPECT_EQ(parse("1,shm=0.0012B/s:0.00125ns").to_string(),
            "1x1,intra=shm:0.0012B/s:0.00125ns,inter=ethernet:1.25GB/s:20us,nics=1,reduce=10GB/s");
}

TEST(ToString, RoundTrip) {
  const cluster clusters[] = {
      cluster(),
      parse("8"),
      parse("3+5"),
      parse("1+4+2+7,nvlink=600GB/s:2.5us,ib=3us,nics=3,reduce=1.7TB/s"),
      parse("2x4,intra=nvlink:900GB/s:2us,inter=ib:400Gb/s:5us"),
      parse("2x4,shm=20GB/s:1us,net=2GB/s:20us"),
      parse("16x2,pcie=0.1GB/s:0.3us,eth=1.1GB/s:1.7ms,reduce=0.7KB/s"),
      weft::topology::dgx_a100(4),
      weft::topology::dgx_h100(2),
      weft::topology::dgx_h200(16),
      weft::topology::host(3),
      cluster({2, 1}, link{link_kind::shm, 1.0 / 3.0, 0.0},
              link{link_kind::ethernet, 1e-300, 1e300}, 7, 123456789.123456789),
      cluster({1}, link{link_kind::nvlink, 5e-324, 5e-324},
              link{link_kind::infiniband, std::numeric_limits<double>::max(), 1e-12}),
  };
  for (const cluster& c : clusters) {
    SCOPED_TRACE(c.to_string());
    const cluster back = parse(c.to_string());
    EXPECT_EQ(back, c);
    // Bit for bit, not merely within a few ulps.
    EXPECT_EQ(std::bit_cast<std::uint64_t>(back.intra().bandwidth),
              std::bit_cast<std::uint64_t>(c.intra().bandwidth));
    EXPECT_EQ(back.to_string(), c.to_string());
  }
}

TEST(ToString, RoundTripRandomFigures) {
  std::mt19937_64 gen(20240611);
  // Every positive finite double has a bit pattern in [1, 0x7fefffffffffffff].
  std::uniform_int_distribution<std::uint64_t> bits(1, 0x7fefffffffffffffULL);
  std::uniform_real_distribution<double> moderate(1e-9, 1e13);
  for (int i = 0; i < 2000; ++i) {
    const double any_bw = std::bit_cast<double>(bits(gen));
    const double any_lat = std::bit_cast<double>(bits(gen));
    const cluster c({1 + i % 5, 3}, link{link_kind::pcie, any_bw, any_lat},
                    link{link_kind::ethernet, moderate(gen), moderate(gen) * 1e-12}, 1 + i % 9,
                    moderate(gen));
    const std::string text = c.to_string();
    ASSERT_EQ(parse(text), c) << text;
  }
}

// ---------------------------------------------------------------------------------------
// presets

TEST(Presets, DgxA100) {
  const cluster c = weft::topology::dgx_a100(4);
  EXPECT_EQ(c.nodes(), 4);
  EXPECT_EQ(c.size(), 32);
  EXPECT_TRUE(c.uniform());
  EXPECT_EQ(c.devices_on(3), 8);
  // 600 GB/s bidirectional NVLink3; HDR 200 Gb/s.
  EXPECT_THAT(c, has_links({link_kind::nvlink, 300e9, 2e-6}, {link_kind::infiniband, 25e9, 5e-6}));
  EXPECT_EQ(c.nics_per_node(), 8);
  EXPECT_DOUBLE_EQ(c.reduce_bandwidth(), 2039e9); // A100 80GB HBM2e
}

TEST(Presets, DgxH100) {
  const cluster c = weft::topology::dgx_h100(2);
  EXPECT_EQ(c.size(), 16);
  EXPECT_EQ(c.node_of(9), 1);
  // 900 GB/s bidirectional NVLink4; NDR 400 Gb/s.
  EXPECT_THAT(c, has_links({link_kind::nvlink, 450e9, 2e-6}, {link_kind::infiniband, 50e9, 5e-6}));
  EXPECT_EQ(c.nics_per_node(), 8);
  EXPECT_DOUBLE_EQ(c.reduce_bandwidth(), 3.35e12); // H100 SXM HBM3
}

TEST(Presets, DgxH200) {
  const cluster c = weft::topology::dgx_h200(1);
  EXPECT_EQ(c.nodes(), 1);
  EXPECT_EQ(c.size(), 8);
  EXPECT_DOUBLE_EQ(c.intra().bandwidth, 450e9);
  EXPECT_EQ(c.inter().kind, link_kind::infiniband);
  EXPECT_DOUBLE_EQ(c.inter().bandwidth, 50e9);
  EXPECT_EQ(c.nics_per_node(), 8);
  EXPECT_DOUBLE_EQ(c.reduce_bandwidth(), 4.8e12); // H200 HBM3e
}

TEST(Presets, Host) {
  const cluster c = weft::topology::host(6);
  EXPECT_EQ(c.nodes(), 1);
  EXPECT_EQ(c.size(), 6);
  EXPECT_EQ(c.intra(), (link{link_kind::shm, 10e9, 1e-6}));
  EXPECT_EQ(c.link_between(0, 5).kind, link_kind::shm);
}

TEST(Presets, RejectBadCounts) {
  EXPECT_THROW((void)weft::topology::dgx_a100(0), weft::error);
  EXPECT_THROW((void)weft::topology::dgx_h100(-1), weft::error);
  EXPECT_THROW((void)weft::topology::dgx_h200(0), weft::error);
  EXPECT_THROW((void)weft::topology::host(0), weft::error);
}

// ---------------------------------------------------------------------------------------
// parse: errors

TEST(ParseErrors, MessageNamesTheTokenAndWhatWasExpected) {
  EXPECT_EQ(parse_error("2x4,intra=nvlink:900XB/s"),
            "weft: topology spec \"2x4,intra=nvlink:900XB/s\": bad bandwidth \"900XB/s\": expected "
            "a number and a unit B/s, KB/s, MB/s, GB/s, TB/s, Kb/s, Mb/s, Gb/s or Tb/s");
  EXPECT_EQ(parse_error("2x4,shm=1GB/s:3xs"),
            "weft: topology spec \"2x4,shm=1GB/s:3xs\": bad latency \"3xs\": expected a number "
            "and a unit ns, us, ms or s");
}

TEST(ParseErrors, Empty) {
  EXPECT_THAT(parse_error(""), HasSubstr("empty spec"));
  EXPECT_THAT(parse_error("   "), HasSubstr("empty spec"));
  expect_rejected(",shm=1GB/s", "");
}

TEST(ParseErrors, BadShape) {
  expect_rejected("abc", "abc");
  expect_rejected("2x4y", "4y");
  expect_rejected("2x", "");
  expect_rejected("x4", "");
  expect_rejected("2x4x3", "2x4x3");
  expect_rejected("3+", "3+");
  expect_rejected("3+-5", "-5");
  expect_rejected("2.5", "2.5");
  expect_rejected("intra=nvlink,2x4", "intra=nvlink");
  expect_rejected("2x4 intra=nvlink", "2x4 intra=nvlink");
  expect_rejected("99999999999x2", "99999999999");
  expect_rejected("65536x65536", "65536x65536"); // 2^32 devices
}

// Found by tests/fuzz/topology_spec_fuzz.cpp: a node count that fits in an int but would
// allocate gigabytes of per-node data is refused, with the bound in the message.
TEST(ParseErrors, TooManyNodes) {
  expect_rejected("2000000000x1", "2000000000x1");
  EXPECT_THAT(parse_error("100000000x2"), HasSubstr("more than 65536 nodes"));
  EXPECT_NO_THROW((void)weft::topology::parse("65536x1"));
}

TEST(ParseErrors, ZeroNodesOrDevices) {
  expect_rejected("0x4", "0x4");
  EXPECT_THAT(parse_error("0x4"), HasSubstr("at least one node"));
  expect_rejected("2x0", "2x0");
  EXPECT_THAT(parse_error("2x0"), HasSubstr("at least one device"));
  expect_rejected("0", "0");
  expect_rejected("3+0+2", "3+0+2");
  EXPECT_THAT(parse_error("3+0+2"), HasSubstr("node 1"));
}

TEST(ParseErrors, UnknownKeyOrKind) {
  expect_rejected("2x4,foo=3", "foo");
  expect_rejected("2x4,bandwidth=3GB/s", "bandwidth");
  expect_rejected("2x4,intra=warp:1GB/s", "warp");
  expect_rejected("2x4,inter=tcp:1GB/s", "tcp");
  expect_rejected("2x4,intra=", "");
  expect_rejected("2x4,shm", "shm");
  EXPECT_THAT(parse_error("2x4,shm"), HasSubstr("KEY=VALUE"));
}

TEST(ParseErrors, KindInWrongClass) {
  expect_rejected("2x4,inter=nvlink:100GB/s", "nvlink");
  EXPECT_THAT(parse_error("2x4,inter=nvlink:100GB/s"), HasSubstr("intra-node link kind"));
  expect_rejected("2x4,intra=ib:50GB/s:5us", "ib");
  expect_rejected("2x4,intra=net", "net");
  expect_rejected("2x4,inter=shm:1GB/s", "shm");
}

TEST(ParseErrors, BadUnits) {
  expect_rejected("2x4,shm=20GB", "20GB");
  expect_rejected("2x4,shm=20gb/s", "20gb/s");
  expect_rejected("2x4,shm=20:1us", "20");
  expect_rejected("2x4,shm=20GB/s:1", "1");
  expect_rejected("2x4,shm=20GB/s:1sec", "1sec");
  expect_rejected("2x4,shm=20GB/s:1us/s", "1us/s");
  expect_rejected("2x4,reduce=12", "12");
  expect_rejected("2x4,reduce=1us", "1us");
  expect_rejected("2x4,shm=1GB/s:5GB/s", "5GB/s");
}

TEST(ParseErrors, BadNumbers) {
  expect_rejected("2x4,shm=-1us", "-1us");
  expect_rejected("2x4,shm=.5GB/s", ".5GB/s");
  expect_rejected("2x4,shm=5.GB/s", "5.GB/s");
  expect_rejected("2x4,shm=1..5GB/s", "1..5GB/s");
  expect_rejected("2x4,shm=GB/s", "GB/s");
  expect_rejected("2x4,shm=1e999GB/s", "1e999GB/s");
  expect_rejected("2x4,shm=1GB/s:1e-999s", "1e-999s");
  expect_rejected("2x4,shm=0GB/s", "0GB/s");
  EXPECT_THAT(parse_error("2x4,shm=0GB/s"), HasSubstr("positive"));
  expect_rejected("2x4,shm=0.0e5B/s:1us", "0.0e5B/s");
}

// The review of 2026-12-02: a sign or a number out of range was "expected a number and a
// unit", though the user wrote both; bit rates overflowed before the division by 8.
TEST(ParseErrors, SignsAndRangesAreNamed) {
  EXPECT_THAT(parse_error("2x4,shm=-1us"), HasSubstr("a latency cannot be negative"));
  EXPECT_THAT(parse_error("2x4,shm=1GB/s:-5us"), HasSubstr("a latency cannot be negative"));
  EXPECT_THAT(parse_error("2x4,shm=-5GB/s"), HasSubstr("a bandwidth cannot be negative"));
  EXPECT_THAT(parse_error("2x4,shm=1e400GB/s"),
              HasSubstr("\"1e400GB/s\": out of the range of a double"));
  EXPECT_THAT(parse_error("2x4,shm=1e-400us"),
              HasSubstr("\"1e-400us\": out of the range of a double"));
  EXPECT_THAT(parse_error("2x4,shm=1GB/s:1e99999999999us"),
              HasSubstr("out of the range of a double"));
  // 1e306 Kb/s = 1.25e308 B/s, which a double holds.
  EXPECT_EQ(bandwidth_of("1e306Kb/s"), 1.25e308);
  EXPECT_EQ(bandwidth_of("1e305KB/s"), bandwidth_of("8e305Kb/s"));
  EXPECT_EQ(bandwidth_of("0.3Gb/s"), 0.3e9 / 8); // rounded once, as before
  EXPECT_EQ(bandwidth_of("1.7Tb/s"), 1.7e12 / 8);
}

// A+B+... shapes are bounded as NxM ones are, so that to_string()'s NxM reads back.
TEST(ParseErrors, UnevenShapesHaveTheNodeBoundToo) {
  std::string ones = "1";
  for (int i = 1; i < 65536; ++i)
    ones += "+1";
  const auto c = weft::topology::parse(ones);
  EXPECT_EQ(c.nodes(), 65536);
  EXPECT_EQ(weft::topology::parse(c.to_string()), c);
  EXPECT_THAT(parse_error(ones + "+1"), HasSubstr("more than 65536 nodes"));
  EXPECT_THROW((void)weft::topology::dgx_h100(65537), weft::error);
}

TEST(ParseErrors, GarbageAfterANumber) {
  expect_rejected("2x4,nics=4x", "4x");
  expect_rejected("2x4,nics=0", "0");
  expect_rejected("2x4,nics=-2", "-2");
  expect_rejected("2x4,nics=", "");
  expect_rejected("2x4,shm=10GB/sx:1us", "10GB/sx");
  expect_rejected("2x4,shm=10GB/s:1us!", "1us!");
  expect_rejected("2x4,shm=10GB/s:1us:3", "shm=10GB/s:1us:3");
}

TEST(ParseErrors, Duplicates) {
  expect_rejected("2x4,nics=2,nics=4", "nics=4");
  EXPECT_THAT(parse_error("2x4,nics=2,nics=4"), HasSubstr("\"nics=2\""));
  expect_rejected("2x4,reduce=1TB/s,reduce=2TB/s", "reduce=2TB/s");
  expect_rejected("2x4,intra=nvlink,nvlink=1GB/s", "nvlink=1GB/s");
  expect_rejected("2x4,shm=1GB/s,pcie=2GB/s", "pcie=2GB/s");
  expect_rejected("2x4,ib=1GB/s,inter=eth", "inter=eth");
  expect_rejected("2x4,net=1GB/s,eth=2GB/s", "eth=2GB/s");
  expect_rejected("2x4,intra=shm,intra=shm", "intra=shm");
}

TEST(ParseErrors, EmptyOption) {
  expect_rejected("2x4,", "2x4,");
  EXPECT_THAT(parse_error("2x4,"), HasSubstr("empty option"));
  EXPECT_THAT(parse_error("2x4,,nics=2"), HasSubstr("empty option"));
}

} // namespace
