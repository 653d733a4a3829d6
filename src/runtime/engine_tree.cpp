// EAGLE-3 tree drafting (SpecOptions::tree, src/spec/README.md "Tree drafting"). A decode row whose chain
// start holds the draft's K best first tokens grows a tree level by level as SGLang's EAGLE does: each draft
// pass takes the K frontier nodes of every such row (one row each, attending to the sequence's draft entries
// and to its own ancestors' through a token-tree window), and of their K x K children keeps the K best by
// cumulative draft log-probability as the next frontier. The budget's best nodes of everything grown (a
// parent always scores at least its child, so they form a tree) go to one target step as a token tree: the
// root (the sequence's last token) and every node at rotary position begin + depth, stored at the slot of
// position begin + 1 + node, seeing the root and its ancestors. spec/verify_tree.h walks it with the
// request's generator; the kept path's KV moves to the path's positions (ModelRunner::move_kv) and commits as
// a chain's.
#include <algorithm>
#include <functional>
#include <numeric>

#include "runtime/draft_batch.h"
#include "runtime/engine_impl.h"
#include "runtime/token_draw.h"
#include "spec/kv_extent.h"
#include "spec/spec_options.h"
#include "spec/verify_tree.h"

namespace kiln {
namespace {

// A node of a growing tree: its parent (an earlier node, -1 the root), token and cumulative draft
// log-probability; once expanded, its index in the draft's window (draft entry begin + entry) and the
// midlayer output of its pass row, its children's input.
struct Grown {
  int32_t parent = -1;
  int32_t token = -1;
  double score = 0.0;
  int32_t entry = -1;
  std::vector<float> hidden;
};

// Indices in [from, to) of the k best nodes by score, best first; ties go to the earlier node, so a parent
// (never scored below its child) ranks ahead of its children.
std::vector<int32_t> best_nodes(const std::vector<Grown>& g, int32_t from, int32_t to, size_t k) {
  std::vector<int32_t> idx(size_t(to - from));
  std::iota(idx.begin(), idx.end(), from);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](int32_t a, int32_t b) { return g[size_t(a)].score > g[size_t(b)].score; });
  idx.resize(std::min(k, idx.size()));
  return idx;
}

int64_t slot_of(const Sequence& s, int32_t pos, int32_t ps) {
  return int64_t(s.pages[size_t(pos / ps)]) * ps + pos % ps;
}

// The verify step's batch: rows with a tree take their root (the last token, position begin) and every node
// (position begin + depth, slot of begin + 1 + node) with logits at each, in one window of 1 + n positions;
// other rows as planned (window 0), with the plan's logit row. logit_base[i]: row i's first logit row.
// uniform > 0 (a tree graph's step, ModelRunner::verify_graph_bucket): every row takes `uniform` positions
// (decode rows only: its root, its n nodes, then fill rows at slot -1 that see the root and themselves, or
// causal ones where it has no tree) with logits at each, and the batch is padded to `bucket` sequences.
BatchDesc tree_verify_batch(const StepPlan& plan, const std::vector<spec::DraftTree>& trees,
                            const KvPool& pool, int32_t uniform, int32_t bucket,
                            std::vector<int32_t>* logit_base) {
  BatchDesc b;
  const int32_t ps = pool.page_size();
  b.page_size = ps;
  b.cu_q.assign(1, 0);
  for (size_t i = 0; i < plan.rows.size(); ++i)
    b.pages_stride = std::max(
        b.pages_stride, pool.pages_for(plan.rows[i].begin +
                                       std::max(plan.rows[i].q_len + int32_t(trees[i].size()), uniform)));
  logit_base->assign(plan.rows.size(), -1);
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    const StepRow& r = plan.rows[i];
    const Sequence& s = *r.seq;
    const spec::DraftTree& t = trees[i];
    const int32_t n = int32_t(t.size()), real = r.q_len + n, q = std::max(real, uniform);
    KILN_CHECK(uniform == 0 || (r.q_len == 1 && r.samples && real <= uniform),
               "tree verify: a uniform step takes decode rows of at most ", uniform, " positions");
    if (r.samples) (*logit_base)[i] = int32_t(b.logit_rows.size());
    for (int32_t j = 0; j < r.q_len; ++j) {  // the planned rows (a decode row's root)
      const int32_t pos = r.begin + j;
      b.tokens.push_back(s.tokens[size_t(pos)]);
      b.positions.push_back(pos);
      b.slot_mapping.push_back(slot_of(s, pos, ps));
      b.tree_mask.push_back(n > 0 ? 1 : 0);
      if (r.samples && (j + 1 == r.q_len || n > 0 || uniform > 0)) b.logit_rows.push_back(b.cu_q.back() + j);
    }
    std::vector<uint64_t> seen(size_t(n), 0);  // node j's bits: the root's, its ancestors' and its own
    for (int32_t j = 0; j < n; ++j) {
      const int32_t p = t.parents[size_t(j)];
      seen[size_t(j)] = (p < 0 ? uint64_t(1) : seen[size_t(p)]) | (uint64_t(1) << (j + 1));
      b.tokens.push_back(t.tokens[size_t(j)]);
      b.positions.push_back(r.begin + t.depth(j));
      b.slot_mapping.push_back(slot_of(s, r.begin + 1 + j, ps));
      b.tree_mask.push_back(seen[size_t(j)]);
      b.logit_rows.push_back(b.cu_q.back() + r.q_len + j);
    }
    for (int32_t j = real; j < q; ++j) {  // fill: nothing written, nothing reads them
      b.tokens.push_back(0);
      b.positions.push_back(r.begin + 1);
      b.slot_mapping.push_back(-1);
      b.tree_mask.push_back(n > 0 ? (uint64_t(1) | (uint64_t(1) << j)) : 0);
      b.logit_rows.push_back(b.cu_q.back() + j);
    }
    b.cu_q.push_back(b.cu_q.back() + q);
    b.kv_lens.push_back(r.begin + q);
    b.tree_window.push_back(n > 0 ? q : 0);
    b.seq_ids.push_back(s.id);
    const int32_t used = pool.pages_for(r.begin + real);
    for (int32_t p = 0; p < b.pages_stride; ++p)
      b.page_table.push_back(p < used ? s.pages[size_t(p)] : KvPool::kNullPage);
  }
  if (bucket > 0) pad_batch(b, bucket, uniform);
  return b;
}

// The tree graph's batch size for this plan (every row a sampling decode row), or 0: the step runs ragged
// and eagerly. Unlike a chain's fill rows, a tree's sit at rotary position begin + 1 and are never seen, so
// a row near its sequence's limit (a tree cut to the room left) still fits: only the table must (the
// runner's widest graph). Few nodes for the graph's rows (rows without a tree, small trees) run ragged as a
// chain's few drafts do (SpecOptions::ragged_verify_factor), counted in ragged_steps.
int32_t uniform_tree_bucket(const StepPlan& plan, const std::vector<spec::DraftTree>& trees,
                            const ModelRunner& runner, const KvPool& pool, const spec::SpecOptions& so,
                            int64_t* ragged_steps) {
  const int32_t q = so.num_draft_tokens + 1;  // the root and the budget's nodes
  int32_t stride = 0;
  int64_t nodes = 0;
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    const StepRow& r = plan.rows[i];
    if (r.q_len != 1 || !r.samples) return 0;
    stride = std::max(stride, pool.pages_for(r.begin + q));
    nodes += int64_t(trees[i].size());
  }
  const int32_t B = int32_t(plan.rows.size());
  const int32_t bucket = runner.verify_graph_bucket(B, q, stride, true);
  if (bucket > 0 && spec::ragged_verify_rows(so, B, nodes, bucket, q)) {
    ++*ragged_steps;
    return 0;
  }
  return bucket;
}

// One RowSampling per logit row of tree_verify_batch's batch, for rows verified by device draws: the root
// draws the request's token completion, node j the token completion + depth(j) (the token after it on its
// path), each as the plain step drawing that token would. On the kept path the draws are then plain
// decoding's own, so the walk keeps a child where it equals its parent's draw (a point draft x kept with
// probability p(x)) and the emitted tokens follow the target's distribution exactly.
std::vector<ModelRunner::RowSampling> tree_row_sampling(
    const StepPlan& plan, const std::vector<uint8_t>& wants, const std::vector<spec::DraftTree>& trees,
    const std::vector<int32_t>& logit_base, size_t logit_rows,
    const std::function<ModelRunner::RowSampling(size_t row, uint64_t ahead)>& draw) {
  std::vector<ModelRunner::RowSampling> rs(logit_rows);  // rows that want no token: greedy, never read
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    if (!wants[i]) continue;
    rs[size_t(logit_base[i])] = draw(i, 0);
    for (int32_t j = 0; j < int32_t(trees[i].size()); ++j)
      rs[size_t(logit_base[i] + 1 + j)] = draw(i, uint64_t(trees[i].depth(j)));
  }
  return rs;
}

}  // namespace

std::vector<spec::DraftTree> Engine::Impl::eagle_trees(const StepPlan& plan,
                                                       const std::vector<int32_t>& depth,
                                                       const std::vector<int32_t>& budget) {
  const size_t B = plan.rows.size();
  const size_t K = size_t(opts.speculative.eagle_topk);
  const int32_t ps = pool->page_size();
  std::vector<std::vector<Grown>> grown(B);
  std::vector<std::vector<int32_t>> frontier(B);
  std::vector<int32_t> entries(B, 0);
  for (size_t i = 0; i < B; ++i) {
    if (depth[i] <= 0) continue;
    const Eagle3Chain& c = live.at(plan.rows[i].seq->id).eagle;
    KILN_CHECK(c.topk.size() == K && c.topk_logp.size() == K, "tree drafting: the draft pass gave ",
               c.topk.size(), " first tokens, not the ", K, " of --speculative-eagle-topk");
    for (size_t j = 0; j < K; ++j) {
      grown[i].push_back(Grown{-1, c.topk[j], double(c.topk_logp[j])});
      frontier[i].push_back(int32_t(j));
    }
  }
  // Pass d expands the frontier at depth d of every row whose tree is deeper: node f's row sits at rotary
  // position begin + d - 1 (a chain's pass d), takes f's token and its parent's output (the chain start's at
  // depth 1), writes draft entry begin + e (its index in the row's window of expanded nodes) and sees the
  // entries before the window and its ancestors' and its own in it.
  for (int32_t d = 1;; ++d) {
    BatchDesc b = empty_draft_batch(ps);
    std::vector<const Sequence*> seqs;
    std::vector<size_t> who;
    std::vector<float> in;
    for (size_t i = 0; i < B; ++i) {
      if (d >= depth[i] || frontier[i].empty()) continue;
      const StepRow& r = plan.rows[i];
      const Sequence& s = *r.seq;
      const Live& L = live.at(s.id);
      const int32_t q = int32_t(frontier[i].size()), e0 = entries[i];
      entries[i] += q;
      for (int32_t k = 0; k < q; ++k) {
        Grown& f = grown[i][size_t(frontier[i][size_t(k)])];
        f.entry = e0 + k;
        uint64_t bits = 0;
        for (int32_t a = frontier[i][size_t(k)]; a >= 0; a = grown[i][size_t(a)].parent)
          bits |= uint64_t(1) << grown[i][size_t(a)].entry;
        b.tokens.push_back(f.token);
        b.positions.push_back(r.begin + d - 1);
        b.slot_mapping.push_back(slot_of(s, r.begin + f.entry, ps));
        b.tree_mask.push_back(bits);
        b.logit_rows.push_back(b.cu_q.back() + k);
        const std::vector<float>& h = f.parent < 0 ? L.eagle.hidden : grown[i][size_t(f.parent)].hidden;
        in.insert(in.end(), h.begin(), h.end());
      }
      b.cu_q.push_back(b.cu_q.back() + q);
      b.kv_lens.push_back(r.begin + entries[i]);
      b.tree_window.push_back(entries[i]);
      b.seq_ids.push_back(s.id);
      seqs.push_back(&s);
      who.push_back(i);
    }
    if (who.empty()) break;
    fill_page_table(b, seqs);
    ModelRunner::DraftOut out;
    ++counters.spec.draft_passes;
    runner->draft_from_hidden(b, in, &out);
    const size_t rows = b.logit_rows.size();
    KILN_CHECK(out.topk_tokens.size() == rows * K && out.topk_logprobs.size() == rows * K && rows > 0,
               "tree drafting: a draft pass gave ", out.topk_tokens.size(), " top-k tokens for ", rows,
               " rows of ", K);
    const size_t H = out.hidden.size() / rows;
    size_t row = 0;
    for (size_t i : who) {
      const int32_t first = int32_t(grown[i].size());
      for (int32_t f : frontier[i]) {
        grown[i][size_t(f)].hidden.assign(out.hidden.begin() + int64_t(row * H),
                                          out.hidden.begin() + int64_t((row + 1) * H));
        const double base = grown[i][size_t(f)].score;
        for (size_t c = 0; c < K; ++c)
          grown[i].push_back(
              Grown{f, out.topk_tokens[row * K + c], base + double(out.topk_logprobs[row * K + c])});
        ++row;
      }
      frontier[i] = best_nodes(grown[i], first, int32_t(grown[i].size()), K);
    }
  }
  // The budget's best nodes, in the order they grew (a parent before its children).
  std::vector<spec::DraftTree> trees(B);
  for (size_t i = 0; i < B; ++i) {
    if (grown[i].empty()) continue;
    std::vector<int32_t> keep = best_nodes(grown[i], 0, int32_t(grown[i].size()), size_t(budget[i]));
    std::sort(keep.begin(), keep.end());
    std::vector<int32_t> index(grown[i].size(), -1);
    for (int32_t g : keep) {
      const int32_t p = grown[i][size_t(g)].parent;
      KILN_CHECK(p < 0 || index[size_t(p)] >= 0, "tree drafting: node ", g, " kept without its parent ", p);
      index[size_t(g)] =
          trees[i].add(p < 0 ? spec::DraftTree::kRoot : index[size_t(p)], grown[i][size_t(g)].token);
    }
  }
  return trees;
}

bool Engine::Impl::eagle_tree_step(StepPlan& plan, Clock::time_point t0, bool timed,
                                   const std::vector<uint8_t>& wants, const std::vector<int32_t>& asked) {
  const spec::SpecOptions& so = opts.speculative;
  const size_t B = plan.rows.size();
  const int32_t K = so.eagle_topk;
  // Constrained rows would need a grammar mask per node: a step with one stays plain.
  for (const StepRow& r : plan.rows)
    if (live.at(r.seq->id).grammar) return false;
  std::vector<int32_t> depth(B, 0), budget(B, 0);
  std::vector<uint8_t> reserved(B, 0);
  bool any = false;
  for (size_t i = 0; i < B; ++i) {
    if (asked[i] <= 0) continue;
    const StepRow& r = plan.rows[i];
    const Live& L = live.at(r.seq->id);
    if (L.sampler->processor().active()) continue;  // its processing would have to follow every path
    // A path of d nodes emits d + 1 tokens: within the request's room.
    depth[i] = int32_t(std::min<int64_t>(so.eagle_steps, token_room(L, *r.seq) - 1));
    budget[i] = so.num_draft_tokens;
    // Pages for the draft's expanded entries (begin .. begin + K (depth - 1) - 1) and the tree's nodes
    // (begin + 1 .. begin + budget), from the free list only; a row they do not cover drafts nothing.
    const int32_t want = r.begin + 1 + std::max(budget[i], K * (depth[i] - 1));
    reserved[i] = 1;
    if (spec::reserve_draft_pages(*pool, r.seq->pages, want) < want) depth[i] = 0;
    any = any || depth[i] > 0;
  }
  const auto give_back_pages = [&] {
    for (size_t i = 0; i < B; ++i)
      if (reserved[i])
        spec::rollback_pages(*pool, plan.rows[i].seq->pages, int32_t(plan.rows[i].seq->tokens.size()));
  };
  if (!any) {
    give_back_pages();
    return false;
  }
  std::vector<spec::DraftTree> trees;
  if (!eagle_draft([&] { trees = eagle_trees(plan, depth, budget); })) {
    give_back_pages();
    return false;
  }
  const auto fail_step = [&](const std::string& why) {
    give_back_pages();
    fail_plan(plan, why);
    return true;
  };
  const int64_t V = runner->config().vocab_size;
  std::vector<int32_t> logit_base;
  const int32_t bucket =
      uniform_tree_bucket(plan, trees, *runner, *pool, so, &counters.spec.ragged_verify_steps);
  BatchDesc batch =
      tree_verify_batch(plan, trees, *pool, bucket > 0 ? so.num_draft_tokens + 1 : 0, bucket, &logit_base);
  runner->place_positions(batch);
  std::vector<float>& logits = logits_host;
  // As a chain's verify step (engine_spec.cpp): rows without logit processing or logprobs need only each
  // node's draw, taken on the device (tree_row_sampling), so tokens come back, not [nodes, vocab] logits.
  std::vector<ModelRunner::SampledRow> device_tokens;
  bool on_device = false;
  try {
    batch.validate(V, pool->num_pages());
    if (verify_on_device(plan, wants)) {
      const auto draw = [&](size_t i, uint64_t ahead) { return verify_draw(plan.rows[i], ahead); };
      on_device = runner->forward_sampled(
          batch, tree_row_sampling(plan, wants, trees, logit_base, batch.logit_rows.size(), draw), 0,
          &device_tokens);
    }
    if (!on_device) runner->forward(batch, &logits, nullptr);
  } catch (const RunnerFatalError&) {
    throw;
  } catch (const std::exception& e) {
    return fail_step(std::string("model forward failed: ") + e.what());
  }
  // Each row walks its tree with its own generator (spec/verify_tree.h); a row without one draws as a plain
  // step. The emitted positions' rows (the root's, then the kept nodes') give the log-probs.
  std::vector<std::vector<int32_t>> emitted(B), paths(B);
  std::vector<std::vector<Draw>> draws(B);
  for (size_t i = 0; i < B; ++i) {
    if (!wants[i]) continue;
    Live& L = live.at(plan.rows[i].seq->id);
    if (on_device) {  // node -1 the root: its draw is the first emitted token where no child equals it
      const auto target = [&](int32_t node) {
        return spec::TargetPosition{device_tokens[size_t(logit_base[i] + 1 + node)].token, nullptr};
      };
      spec::TreeVerdict v = spec::verify_tree(trees[i], target, L.sampler->generator());
      emitted[i] = std::move(v.tokens);
      paths[i] = std::move(v.path);
      continue;
    }
    const float* rows = logits.data() + size_t(logit_base[i]) * size_t(V);
    if (trees[i].size() == 0) {
      emitted[i] = verify_row(L, rows, {}, {});
      draws[i] = emitted_logprobs(L, rows, emitted[i], {});
      continue;
    }
    const SamplingParams& sp = L.sampler->params();
    spec::Categorical dist;
    const auto target = [&](int32_t node) {
      const float* x = rows + size_t(node + 1) * size_t(V);
      if (sp.temperature <= 0.0f) return spec::TargetPosition{greedy_token(x, V), nullptr};
      token_distribution(x, V, sp, &dist);
      return spec::TargetPosition{-1, &dist};
    };
    spec::TreeVerdict v = spec::verify_tree(trees[i], target, L.sampler->generator());
    emitted[i] = std::move(v.tokens);
    paths[i] = std::move(v.path);
    if (sp.return_logprob || sp.top_logprobs > 0) {
      std::vector<float> path_rows(rows, rows + V);
      for (int32_t node : paths[i])
        path_rows.insert(path_rows.end(), rows + size_t(node + 1) * size_t(V),
                         rows + size_t(node + 2) * size_t(V));
      draws[i] = emitted_logprobs(L, path_rows.data(), emitted[i], {});
    }
  }
  // The kept nodes' KV to their path's positions: node path[j] at begin + 1 + path[j] to begin + 1 + j (up to
  // a stop, past which nothing is kept). The draft's entries there come from the pass after the step.
  std::vector<int64_t> from, to;
  std::vector<std::vector<int32_t>> extend_rows(B);
  for (size_t i = 0; i < B; ++i) {
    const StepRow& r = plan.rows[i];
    for (int32_t j = 0; j < r.q_len; ++j) extend_rows[i].push_back(batch.cu_q[i] + j);
    if (emitted[i].empty() || paths[i].empty()) continue;
    truncate_at_stop(live.at(r.seq->id), emitted[i]);
    const int32_t ps = pool->page_size();
    for (size_t j = 0; j + 1 < emitted[i].size(); ++j) {
      const int32_t node = paths[i][j];
      extend_rows[i].push_back(batch.cu_q[i] + r.q_len + node);
      if (node == int32_t(j)) continue;
      from.push_back(slot_of(*r.seq, r.begin + 1 + node, ps));
      to.push_back(slot_of(*r.seq, r.begin + 1 + int32_t(j), ps));
    }
  }
  if (!from.empty()) {
    counters.spec.tree_moved_tokens += int64_t(from.size());
    try {
      runner->move_kv(from, to);
    } catch (const RunnerFatalError&) {
      throw;
    } catch (const std::exception& e) {
      return fail_step(std::string("moving the kept drafts' KV failed: ") + e.what());
    }
  }
  std::vector<int32_t> drafted(B);
  for (size_t i = 0; i < B; ++i) drafted[i] = int32_t(trees[i].size());
  counters.spec.tree_verify_steps += 1;
  commit_verify(plan, emitted, drafted, draws, batch, &extend_rows, give_back_pages, timed, t0);
  return true;
}

}  // namespace kiln
