// The sweep plot, written by hand: three panels (output tok/s, TTFT, TPOT) against concurrency, log2 x axis.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>

#include "client/report.h"

namespace kiln::client {

namespace {

constexpr double kPanelW = 320, kPanelH = 250, kLeft = 58, kRight = 14, kTop = 44, kBottom = 40;

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

std::string label(double v) {
  char buf[32];
  if (v != 0 && (std::fabs(v) >= 1e5 || std::fabs(v) < 1e-2))
    std::snprintf(buf, sizeof buf, "%.1e", v);
  else
    std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '&')
      out += "&amp;";
    else if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '"')
      out += "&quot;";
    else
      out += c;
  }
  return out;
}

// A 1-2-5 step giving about four intervals up to vmax.
double nice_step(double vmax) {
  if (!(vmax > 0)) return 1;
  const double raw = vmax / 4;
  const double mag = std::pow(10, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * mag) return m * mag;
  return 10 * mag;
}

std::string panel(const SweepResult& r, double x0, const std::string& title,
                  const std::function<double(const LevelMetrics&)>& value) {
  std::string s;
  const double pw = kPanelW - kLeft - kRight, ph = kPanelH - kTop - kBottom;
  const double left = x0 + kLeft, top = kTop, bottom = kTop + ph;
  double lo = 1e300, hi = -1e300, vmax = 0;
  for (const auto& m : r.levels) {
    const double lx = std::log2(double(std::max(1, m.concurrency)));
    lo = std::min(lo, lx);
    hi = std::max(hi, lx);
    vmax = std::max(vmax, value(m));
  }
  if (r.levels.empty()) lo = hi = 0;
  const double step = nice_step(vmax);
  const double ymax = vmax > 0 ? step * std::ceil(vmax / step) : 1;
  constexpr double kPad = 12;  // keeps the end points off the frame
  auto px = [&](int c) {
    if (hi == lo) return left + pw / 2;
    return left + kPad + (std::log2(double(std::max(1, c))) - lo) / (hi - lo) * (pw - 2 * kPad);
  };
  auto py = [&](double v) { return bottom - v / ymax * ph; };

  s += "<text x=\"" + num(x0 + kPanelW / 2) + "\" y=\"" + num(kTop - 12) +
       "\" text-anchor=\"middle\" font-weight=\"bold\">" + escape(title) + "</text>\n";
  s += "<rect x=\"" + num(left) + "\" y=\"" + num(top) + "\" width=\"" + num(pw) + "\" height=\"" + num(ph) +
       "\" fill=\"none\" stroke=\"#888\"/>\n";
  for (double v = 0; v <= ymax * (1 + 1e-9); v += step) {
    s += "<line x1=\"" + num(left) + "\" x2=\"" + num(left + pw) + "\" y1=\"" + num(py(v)) + "\" y2=\"" +
         num(py(v)) + "\" stroke=\"#ddd\"/>\n";
    s += "<text x=\"" + num(left - 4) + "\" y=\"" + num(py(v) + 4) + "\" text-anchor=\"end\">" + label(v) +
         "</text>\n";
  }
  for (const auto& m : r.levels)
    s += "<text x=\"" + num(px(m.concurrency)) + "\" y=\"" + num(bottom + 16) + "\" text-anchor=\"middle\">" +
         std::to_string(m.concurrency) + "</text>\n";
  s += "<text x=\"" + num(left + pw / 2) + "\" y=\"" + num(bottom + 34) +
       "\" text-anchor=\"middle\">concurrency (log2)</text>\n";
  std::string pts;
  for (const auto& m : r.levels) pts += num(px(m.concurrency)) + "," + num(py(value(m))) + " ";
  if (r.levels.size() > 1)
    s += "<polyline points=\"" + pts + "\" fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\"/>\n";
  for (const auto& m : r.levels) {
    const std::string fill = m.valid ? "#1f77b4" : "white";
    const std::string stroke = m.valid ? "#1f77b4" : "#d62728";
    s += "<circle cx=\"" + num(px(m.concurrency)) + "\" cy=\"" + num(py(value(m))) + "\" r=\"3.5\" fill=\"" +
         fill + "\" stroke=\"" + stroke +
         "\" stroke-width=\"1.5\"><title>C=" + std::to_string(m.concurrency) + ": " + label(value(m)) +
         (m.valid ? "" : " (invalid)") + "</title></circle>\n";
  }
  return s;
}

}  // namespace

std::string sweep_to_svg(const SweepResult& r, const std::string& title) {
  const double width = 3 * kPanelW, height = kPanelH + 26;
  std::string s = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(width) + "\" height=\"" +
                  num(height) + "\" viewBox=\"0 0 " + num(width) + " " + num(height) +
                  "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s += "<text x=\"8\" y=\"16\" font-size=\"12\">" + escape(title) + "</text>\n";
  s += panel(r, 0, "output tok/s", [](const LevelMetrics& m) { return m.output_tok_s; });
  s += panel(r, kPanelW, "TTFT mean (ms)", [](const LevelMetrics& m) { return m.ttft_ms.mean; });
  s += panel(r, 2 * kPanelW, "TPOT mean (ms)", [](const LevelMetrics& m) { return m.tpot_ms.mean; });
  std::string invalid;
  for (const auto& m : r.levels)
    if (!m.valid) invalid += (invalid.empty() ? "" : ", ") + std::to_string(m.concurrency);
  if (!invalid.empty())
    s += "<text x=\"8\" y=\"" + num(height - 6) +
         "\" fill=\"#d62728\">invalid levels (hollow): C=" + invalid + "</text>\n";
  s += "</svg>\n";
  return s;
}

}  // namespace kiln::client
