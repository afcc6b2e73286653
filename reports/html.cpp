#include "reports/html.h"

#include <sstream>

#include "reports/svg.h"

namespace vlatune::reports {

namespace {

constexpr const char* kStyle =
    R"(body{font-family:sans-serif;margin:24px auto;max-width:1000px;color:#222;background:#fff}
h1{font-size:22px;margin-bottom:4px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd;padding-bottom:3px}
p.intro{color:#555;margin:2px 0}nav{margin:12px 0;font-size:13px}nav a{margin-right:12px;color:#36c}
table{border-collapse:collapse;font-size:12px;margin:8px 0}th,td{border:1px solid #ddd;padding:3px 6px;text-align:left;vertical-align:top}
td:not(.num){overflow-wrap:anywhere}td.num{white-space:nowrap}
th{background:#f4f4f4}td.num{text-align:right;font-variant-numeric:tabular-nums}svg.chart{display:block;margin:8px 0}
p.note{color:#666;font-size:12px})";

}  // namespace

std::string escape_html(const std::string& text) {
  return svg::escape(text);
}

std::string html_table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows,
                       size_t numeric_from) {
  std::ostringstream o;
  o << "<table><thead><tr>";
  for (const auto& h : header) o << "<th>" << escape_html(h) << "</th>";
  o << "</tr></thead><tbody>";
  for (const auto& r : rows) {
    o << "<tr>";
    for (size_t i = 0; i < r.size(); ++i) {
      o << (i >= numeric_from ? "<td class=\"num\">" : "<td>") << escape_html(r[i]) << "</td>";
    }
    o << "</tr>";
  }
  o << "</tbody></table>";
  return o.str();
}

void HtmlPage::add_section(const std::string& id, const std::string& heading, const std::string& body_html) {
  sections_.push_back({id, heading, body_html});
}

void HtmlPage::add_intro(const std::string& text) {
  intro_.push_back(text);
}

std::string HtmlPage::render() const {
  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>" << escape_html(title_)
    << "</title><style>" << kStyle << "</style></head><body>\n<h1>" << escape_html(title_) << "</h1>\n";
  for (const auto& t : intro_) o << "<p class=\"intro\">" << escape_html(t) << "</p>\n";
  o << "<nav>";
  for (const auto& s : sections_) o << "<a href=\"#" << escape_html(s.id) << "\">" << escape_html(s.heading) << "</a>";
  o << "</nav>\n";
  for (const auto& s : sections_) {
    o << "<section id=\"" << escape_html(s.id) << "\"><h2>" << escape_html(s.heading) << "</h2>\n"
      << s.body << "\n</section>\n";
  }
  o << "</body></html>\n";
  return o.str();
}

}  // namespace vlatune::reports
