#include "report.h"

#include <cmath>
#include <cstdio>
#include <sstream>

namespace tpfuse::bench {

namespace {

std::string format_cell(const Value& value, const Column& column) {
  if (const auto* text = std::get_if<std::string>(&value)) return *text;
  if (const auto* yes = std::get_if<bool>(&value)) return *yes ? "yes" : "no";
  const auto* number = std::get_if<double>(&value);
  if (number == nullptr) return column.format == Format::kText ? "" : "-";
  if (std::isnan(*number)) return "nan";
  char buffer[64];
  switch (column.format) {
    case Format::kInteger: std::snprintf(buffer, sizeof(buffer), "%.0f", *number); break;
    case Format::kScientific: std::snprintf(buffer, sizeof(buffer), "%.*e", column.precision, *number); break;
    default: std::snprintf(buffer, sizeof(buffer), "%.*f", column.precision, *number); break;
  }
  return buffer;
}

std::string json_string(const std::string& text) {
  std::string quoted = "\"";
  for (const char c : text) {
    switch (c) {
      case '"': quoted += "\\\""; break;
      case '\\': quoted += "\\\\"; break;
      case '\n': quoted += "\\n"; break;
      case '\t': quoted += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
          quoted += escaped;
        } else {
          quoted += c;
        }
    }
  }
  return quoted + "\"";
}

// JSON has no NaN or infinity: those become null.
std::string json_value(const Value& value) {
  if (const auto* text = std::get_if<std::string>(&value)) return json_string(*text);
  if (const auto* yes = std::get_if<bool>(&value)) return *yes ? "true" : "false";
  const auto* number = std::get_if<double>(&value);
  if (number == nullptr || !std::isfinite(*number)) return "null";
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.17g", *number);
  return buffer;
}

// `"key": value` lines of an object whose braces are at `indent`.
std::vector<std::string> json_members(const Fields& fields, const std::string& indent) {
  std::vector<std::string> members;
  for (const auto& [key, value] : fields) {
    members.push_back(indent + "  " + json_string(key) + ": " + json_value(value));
  }
  return members;
}

std::string json_object(const std::vector<std::string>& members, const std::string& indent) {
  if (members.empty()) return "{}";
  std::string out = "{";
  for (size_t i = 0; i < members.size(); ++i) out += (i == 0 ? "\n" : ",\n") + members[i];
  return out + "\n" + indent + "}";
}

std::string json_object(const Fields& fields, const std::string& indent) {
  return json_object(json_members(fields, indent), indent);
}

// A CSV cell: numbers in full precision, texts quoted when they hold a comma or a quote.
std::string csv_value(const Value& value) {
  if (const auto* text = std::get_if<std::string>(&value)) {
    if (text->find_first_of(",\"\n") == std::string::npos) return *text;
    std::string quoted = "\"";
    for (const char c : *text) quoted += (c == '"') ? std::string("\"\"") : std::string(1, c);
    return quoted + "\"";
  }
  if (const auto* yes = std::get_if<bool>(&value)) return *yes ? "true" : "false";
  const auto* number = std::get_if<double>(&value);
  if (number == nullptr) return "";
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.17g", *number);
  return buffer;
}

Value lookup(const Row& row, const std::string& key) {
  const auto it = row.find(key);
  return it == row.end() ? Value{} : it->second;
}

}  // namespace

void Report::add_note(const std::string& note) {
  notes_.push_back(note);
  std::fprintf(out_, "# %s\n", note.c_str());
  std::fflush(out_);
}

void Report::print_header() {
  std::string line = "#";
  for (const Column& column : columns_) {
    if (!column.in_table) continue;
    char cell[128];
    std::snprintf(cell, sizeof(cell), column.format == Format::kText ? " %-*s" : " %*s", column.width,
                  column.header.c_str());
    line += cell;
  }
  std::fprintf(out_, "%s\n", line.c_str());
  std::fflush(out_);
}

void Report::add_row(Row row) {
  std::string line = " ";
  for (const Column& column : columns_) {
    if (!column.in_table) continue;
    char cell[512];
    std::snprintf(cell, sizeof(cell), column.format == Format::kText ? " %-*s" : " %*s", column.width,
                  format_cell(lookup(row, column.key), column).c_str());
    line += cell;
  }
  std::fprintf(out_, "%s\n", line.c_str());
  std::fflush(out_);
  rows_.push_back(std::move(row));
}

void Report::set_summary(const std::string& line, Row values) {
  summary_ = std::move(values);
  std::fprintf(out_, "# %s\n", line.c_str());
  std::fflush(out_);
}

std::string Report::json(const Fields& meta, const Fields& options) const {
  std::vector<std::string> meta_members = json_members(meta, "  ");
  meta_members.push_back("    \"options\": " + json_object(options, "    "));
  std::string out = "{\n  \"meta\": " + json_object(meta_members, "  ") + ",\n";

  out += "  \"notes\": [";
  for (size_t i = 0; i < notes_.size(); ++i) out += (i == 0 ? "\n    " : ",\n    ") + json_string(notes_[i]);
  out += notes_.empty() ? "],\n" : "\n  ],\n";

  out += "  \"results\": [";
  for (size_t r = 0; r < rows_.size(); ++r) {
    Fields fields;
    for (const Column& column : columns_) fields.emplace_back(column.key, lookup(rows_[r], column.key));
    out += (r == 0 ? "\n    " : ",\n    ") + json_object(fields, "    ");
  }
  out += rows_.empty() ? "],\n" : "\n  ],\n";

  Fields summary(summary_.begin(), summary_.end());
  return out + "  \"summary\": " + json_object(summary, "  ") + "\n}\n";
}

std::string Report::csv() const {
  std::ostringstream out;
  for (size_t i = 0; i < columns_.size(); ++i) out << (i == 0 ? "" : ",") << columns_[i].key;
  out << "\n";
  for (const Row& row : rows_) {
    for (size_t i = 0; i < columns_.size(); ++i) out << (i == 0 ? "" : ",") << csv_value(lookup(row, columns_[i].key));
    out << "\n";
  }
  return out.str();
}

}  // namespace tpfuse::bench
