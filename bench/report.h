// The results of a run: a table printed row by row as shapes finish (nccl-tests style: comment lines
// start with '#'), a summary line, and the same numbers as JSON and CSV. Knows nothing of CUDA or of
// the modes: a mode declares its columns and adds rows.
#pragma once

#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace tpfuse::bench {

// A cell: empty (not measured), a number, a text, or a yes/no.
using Value = std::variant<std::monostate, double, std::string, bool>;
// Ordered key-value pairs, for the metadata.
using Fields = std::vector<std::pair<std::string, Value>>;
// A row: values by column key.
using Row = std::map<std::string, Value>;

enum class Format { kInteger, kFixed, kScientific, kText };

struct Column {
  std::string key;     // in JSON and CSV
  std::string header;  // in the table
  int width = 10;
  Format format = Format::kFixed;
  int precision = 4;       // digits after the point (kFixed, kScientific)
  bool in_table = true;    // false: JSON and CSV only
};

class Report {
 public:
  explicit Report(FILE* out) : out_(out) {}

  void set_columns(std::vector<Column> columns) { columns_ = std::move(columns); }
  // A "# ..." line, printed now and kept for the JSON.
  void add_note(const std::string& note);
  void print_header();
  // Printed now (progress on long runs).
  void add_row(Row row);
  // The closing "# ..." line and its numbers.
  void set_summary(const std::string& line, Row values);

  // A shape whose result is wrong or whose call failed; the exit status counts these.
  void count_failure() { ++failures_; }
  int failures() const { return failures_; }

  // {"meta": {...meta, "options": {...}}, "notes": [...], "results": [...], "summary": {...}}
  std::string json(const Fields& meta, const Fields& options) const;
  // A header of column keys, then one line per row.
  std::string csv() const;

 private:
  FILE* out_;
  std::vector<Column> columns_;
  std::vector<std::string> notes_;
  std::vector<Row> rows_;
  Row summary_;
  int failures_ = 0;
};

}  // namespace tpfuse::bench
