// A self-contained HTML page: inline CSS, inline SVG, no scripts, no network. Sections are appended in order;
// render() gives the same bytes for the same calls.
#pragma once

#include <string>
#include <vector>

namespace vlatune::reports {

// Text for HTML element content and attribute values.
std::string escape_html(const std::string& text);

// A table of text cells (escaped here). `numeric_from`: columns at or after this index are right-aligned.
std::string html_table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows,
                       size_t numeric_from = 1);

class HtmlPage {
 public:
  explicit HtmlPage(std::string title) : title_(std::move(title)) {}
  // `body_html` is trusted markup (tables, SVG, escaped text). `id` is the anchor in the contents list.
  void add_section(const std::string& id, const std::string& heading, const std::string& body_html);
  // A paragraph of plain text under the page title (inputs, provenance).
  void add_intro(const std::string& text);
  std::string render() const;

 private:
  struct Section {
    std::string id, heading, body;
  };
  std::string title_;
  std::vector<std::string> intro_;
  std::vector<Section> sections_;
};

}  // namespace vlatune::reports
