#include "server/metrics.h"

#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace kiln::server {
namespace {

class Writer {
 public:
  explicit Writer(std::string model) : labels_("model_name=\"" + escape(model) + "\"") {}

  void header(const char* name, const char* type, const char* help) {
    os_ << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
  }
  void sample(const std::string& name, double v, const std::string& extra = "") {
    os_ << name << '{' << labels_ << (extra.empty() ? "" : ",") << extra << "} " << num(v) << '\n';
  }
  void gauge(const char* name, const char* help, double v) {
    header(name, "gauge", help);
    sample(name, v);
  }
  void counter(const char* name, const char* help, double v) {
    header(name, "counter", help);
    sample(name, v);
  }
  void histogram(const char* name, const char* help, const Histogram& h) {
    header(name, "histogram", help);
    const std::string n = name;
    for (size_t i = 0; i < h.bounds.size() && i < h.counts.size(); ++i)
      sample(n + "_bucket", double(h.counts[i]), "le=\"" + num(h.bounds[i]) + "\"");
    sample(n + "_bucket", double(h.count), "le=\"+Inf\"");
    sample(n + "_sum", h.sum);
    sample(n + "_count", double(h.count));
  }
  std::string str() const { return os_.str(); }

  static std::string num(double v) {
    char buf[64];
    for (int prec = 15; prec <= 17; ++prec) {  // shortest text that reads back exactly
      std::snprintf(buf, sizeof buf, "%.*g", prec, v);
      if (std::strtod(buf, nullptr) == v) break;
    }
    return buf;
  }

 private:
  static std::string escape(const std::string& s) {
    std::string o;
    for (char ch : s) {
      if (ch == '\\' || ch == '"') o += '\\';
      if (ch == '\n') {
        o += "\\n";
        continue;
      }
      o += ch;
    }
    return o;
  }
  std::ostringstream os_;
  std::string labels_;
};

}  // namespace

std::string render_metrics(const EngineStats& s, const ServerCounters& c, const std::string& model_name) {
  Writer w(model_name);
  w.gauge("kiln_num_running_requests", "Requests holding KV pages (decoding or mid-prefill).", s.running);
  w.gauge("kiln_num_waiting_requests", "Requests queued or preempted, waiting for admission.", s.waiting);
  w.gauge("kiln_kv_pages_total", "KV cache pages in the pool.", double(s.kv_pages_total));
  w.gauge("kiln_kv_pages_used", "KV pages referenced by live requests.", double(s.kv_pages_used));
  w.gauge("kiln_kv_pages_cached", "KV pages held only by the prefix cache (evictable).",
          double(s.kv_pages_cached));
  w.gauge("kiln_kv_pages_free", "KV pages on the free list.", double(s.kv_pages_free));
  w.gauge("kiln_kv_page_size_tokens", "Tokens per KV page.", s.page_size);
  w.gauge("kiln_kv_usage_ratio", "Fraction of KV pages used by live requests.",
          s.kv_pages_total > 0 ? double(s.kv_pages_used) / double(s.kv_pages_total) : 0.0);
  w.counter("kiln_prompt_tokens_total", "Prompt tokens processed.", double(s.prompt_tokens_total));
  w.counter("kiln_generation_tokens_total", "Tokens generated.", double(s.generation_tokens_total));
  w.counter("kiln_cached_tokens_total", "Prompt tokens served from the prefix cache.",
            double(s.cached_tokens_total));
  w.counter("kiln_requests_submitted_total", "Requests accepted by the engine.",
            double(s.requests_submitted));
  w.counter("kiln_requests_rejected_total", "Requests refused by the engine at submission.",
            double(s.requests_rejected));
  w.header("kiln_requests_finished_total", "counter", "Engine requests by end state.");
  w.sample("kiln_requests_finished_total", double(s.finished_stop), "reason=\"stop\"");
  w.sample("kiln_requests_finished_total", double(s.finished_length), "reason=\"length\"");
  w.sample("kiln_requests_finished_total", double(s.finished_abort), "reason=\"abort\"");
  w.sample("kiln_requests_finished_total", double(s.finished_error), "reason=\"error\"");
  w.counter("kiln_preemptions_total", "Requests preempted (pages freed, recomputed later).",
            double(s.preemptions));
  w.counter("kiln_engine_steps_total", "Engine steps run.", double(s.steps));
  // Speculative decoding (spec/spec_stats.h), vLLM's series beside kiln's names (metrics_compat.cpp).
  const spec::SpecStats& sp = s.spec;
  w.counter("kiln_spec_decode_verify_steps_total", "Engine steps that verified drafts.",
            double(sp.verify_steps));
  w.counter("kiln_spec_decode_ragged_verify_steps_total",
            "Verify steps run ragged (few sequences drafted) where a verify graph existed.",
            double(sp.ragged_verify_steps));
  w.counter("kiln_spec_decode_tree_verify_steps_total",
            "Verify steps over EAGLE-3 token trees (--speculative-eagle-topk above 1).",
            double(sp.tree_verify_steps));
  w.counter("kiln_spec_decode_shadow_drafts_total",
            "n-gram drafts made where speculation was off, judged against the decoded tokens.",
            double(sp.shadow_drafts));
  w.counter("kiln_spec_decode_shadow_accepted_tokens_total",
            "Tokens a verify step would have kept of the shadow drafts.", double(sp.shadow_accepted_tokens));
  w.counter("kiln_spec_decode_drafts_total", "Verify rows that carried at least one draft token.",
            double(sp.drafts));
  w.counter("kiln_spec_decode_draft_tokens_total", "Draft tokens verified.", double(sp.draft_tokens));
  w.counter("kiln_spec_decode_accepted_tokens_total", "Draft tokens accepted.", double(sp.accepted_tokens));
  w.header("kiln_spec_decode_accepted_tokens_per_pos_total", "counter",
           "Drafts whose token at this position was accepted.");
  for (size_t i = 0; i < sp.accepted_per_pos.size(); ++i)
    w.sample("kiln_spec_decode_accepted_tokens_per_pos_total", double(sp.accepted_per_pos[i]),
             "position=\"" + std::to_string(i) + "\"");
  w.gauge("kiln_spec_decode_acceptance_rate", "Accepted / drafted tokens since start (0: none drafted).",
          sp.acceptance_rate());
  w.gauge("kiln_spec_decode_mean_acceptance_length",
          "Tokens per verify row with drafts, the target's own included (0: none yet).",
          sp.mean_acceptance_length());
  w.counter("kiln_spec_decode_off_switch_total",
            "Times the automatic off switch turned speculation off for a batch size.",
            double(sp.switched_off));
  w.counter("kiln_spec_decode_draft_seconds_total",
            "Host seconds making drafts (n-gram lookups, EAGLE-3 passes with their device waits).",
            sp.draft_seconds);
  w.counter("kiln_spec_decode_draft_chain_seconds_total",
            "EAGLE-3: the part of the draft seconds spent in chains (the rest: the passes after steps).",
            sp.draft_chain_seconds);
  w.counter("kiln_spec_decode_indexed_during_forward_tokens_total",
            "n-gram: tokens indexed while a step's forward ran on the device.",
            double(sp.indexed_during_forward));
  w.counter("kiln_spec_decode_index_during_forward_seconds_total",
            "n-gram: host seconds indexing while a step's forward ran (off the step's critical path).",
            sp.index_during_forward_seconds);
  w.counter("kiln_spec_decode_verify_step_seconds_total",
            "Seconds of decode-only steps that verified drafts, start to end (EAGLE-3: its passes included).",
            sp.verify_step_seconds);
  w.counter("kiln_spec_decode_timed_verify_steps_total", "Decode-only verify steps timed.",
            double(sp.timed_verify_steps));
  w.counter("kiln_spec_decode_plain_step_seconds_total",
            "Seconds of decode-only plain steps while speculation was configured, start to end.",
            sp.plain_step_seconds);
  w.counter("kiln_spec_decode_timed_plain_steps_total", "Decode-only plain steps timed.",
            double(sp.timed_plain_steps));
  w.histogram("kiln_time_to_first_token_seconds", "Time from submission to the first token.", s.ttft);
  w.histogram("kiln_time_per_output_token_seconds", "Mean time per output token after the first.", s.tpot);
  w.histogram("kiln_e2e_request_latency_seconds", "Time from submission to the end of the request.", s.e2e);
  w.counter("kiln_grammar_masks_total", "Structured output: token masks computed (one per constrained draw).",
            double(s.grammar_masks));
  w.histogram("kiln_grammar_mask_seconds", "Structured output: time to compute one request's token mask.",
              s.grammar_mask);
  w.gauge("kiln_grammar_mask_max_seconds", "Structured output: the longest token mask so far.",
          s.grammar_mask_max);
  w.counter("kiln_grammar_steps_not_overlapped_total",
            "Structured output: decode steps the overlap schedule ran one at a time because a row was "
            "constrained.",
            double(s.grammar_steps_not_overlapped));

  w.gauge("kiln_server_active_requests", "HTTP requests accepted and not yet ended.",
          double(c.active.load()));
  w.counter("kiln_server_requests_accepted_total", "HTTP requests handed to the engine.",
            double(c.accepted.load()));
  w.header("kiln_server_requests_finished_total", "counter", "Accepted HTTP requests by outcome.");
  w.sample("kiln_server_requests_finished_total", double(c.completed.load()), "outcome=\"completed\"");
  w.sample("kiln_server_requests_finished_total", double(c.errored.load()), "outcome=\"error\"");
  w.sample("kiln_server_requests_finished_total", double(c.aborted.load()), "outcome=\"aborted\"");
  w.header("kiln_server_requests_rejected_total", "counter", "HTTP requests refused before submission.");
  w.sample("kiln_server_requests_rejected_total", double(c.rejected_invalid.load()), "reason=\"invalid\"");
  w.sample("kiln_server_requests_rejected_total", double(c.rejected_busy.load()), "reason=\"busy\"");
  w.sample("kiln_server_requests_rejected_total", double(c.rejected_auth.load()), "reason=\"auth\"");
  w.sample("kiln_server_requests_rejected_total", double(c.rejected_timeout.load()), "reason=\"timeout\"");
  w.gauge("kiln_server_connections_open", "HTTP connections open now.", double(c.connections_open.load()));
  w.counter("kiln_server_connections_total", "HTTP connections accepted.",
            double(c.connections_total.load()));
  w.counter("kiln_server_connections_rejected_total", "HTTP connections refused with 503 (over the cap).",
            double(c.connections_rejected.load()));
  return w.str();
}

}  // namespace kiln::server
