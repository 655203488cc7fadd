#pragma once
// Reads the CSV files of data/: empty lines and lines that start with '#' are comments, the
// first other line names the columns, and each later line is a row of as many comma-separated
// fields (the files quote nothing). A row's fields are looked up by column name.
#include <weft/core/error.hpp>

#include <cstddef>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace weft_test {

/// The repository's data folder, found from this file's path (CMake compiles by absolute path).
inline std::string data_dir() {
  std::string here = __FILE__;
  return here.substr(0, here.rfind("/tests/sim/")) + "/data";
}

/// One row of a data file: its fields by column name, and where it stands ("path:line") for
/// the errors about it.
class csv_row {
public:
  csv_row(std::string where, std::map<std::string, std::string> fields)
      : where_(std::move(where)), fields_(std::move(fields)) {}

  [[nodiscard]] const std::string& where() const noexcept { return where_; }

  /// The field under `column`; weft::error naming the row and the column where the file has no
  /// such column.
  [[nodiscard]] const std::string& at(const std::string& column) const {
    const auto it = fields_.find(column);
    if (it == fields_.end()) throw weft::error(where_ + ": no column '" + column + "'");
    return it->second;
  }

  /// The field under `column` as a whole integer or number; weft::error naming the row, the
  /// column and the field where the field is not one (trailing characters included).
  [[nodiscard]] int integer(const std::string& column) const {
    return parsed<int>(column, "an integer",
                       [](const std::string& s, std::size_t* end) { return std::stoi(s, end); });
  }
  [[nodiscard]] double number(const std::string& column) const {
    return parsed<double>(column, "a number",
                          [](const std::string& s, std::size_t* end) { return std::stod(s, end); });
  }

private:
  template <class T, class Parse>
  T parsed(const std::string& column, const char* what, Parse parse) const {
    const std::string& field = at(column);
    std::size_t end = 0;
    try {
      const auto v = parse(field, &end);
      if (end == field.size()) return v;
    } catch (const std::logic_error&) { // std::invalid_argument, std::out_of_range
    }
    throw weft::error(where_ + ": " + column + " '" + field + "' is not " + what);
  }

  std::string where_;
  std::map<std::string, std::string> fields_;
};

/// The rows of the CSV file at `path`; weft::error where it cannot be opened, has no header, or
/// has a row whose field count differs from the header's.
inline std::vector<csv_row> read_csv_rows(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw weft::error("cannot open " + path);
  std::vector<std::string> header;
  std::vector<csv_row> rows;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> cells;
    std::stringstream ss(line);
    std::string cell;
    while (std::getline(ss, cell, ','))
      cells.push_back(cell);
    if (line.back() == ',') cells.emplace_back();
    if (header.empty()) {
      header = std::move(cells);
      continue;
    }
    const std::string where = path + ":" + std::to_string(number);
    if (cells.size() != header.size())
      throw weft::error(where + ": a row of " + std::to_string(cells.size()) +
                        " cells under a header of " + std::to_string(header.size()) + ": " + line);
    std::map<std::string, std::string> fields;
    for (std::size_t i = 0; i < cells.size(); ++i)
      fields[header[i]] = std::move(cells[i]);
    rows.emplace_back(where, std::move(fields));
  }
  if (header.empty()) throw weft::error(path + ": no header line");
  return rows;
}

} // namespace weft_test
