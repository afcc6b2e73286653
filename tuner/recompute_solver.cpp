#include "tuner/recompute_solver.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>

namespace vlatune::tuner {

namespace {

struct Forest {
  std::vector<std::vector<int>> children;
  std::vector<int> roots;
  std::vector<int64_t> own_bytes;  // act minus the children's act, >= 0
};

Forest build_forest(const RecomputeProblem& p) {
  const int n = static_cast<int>(p.items.size());
  if (p.quantum_bytes < 1) throw std::invalid_argument("recompute solver: quantum_bytes must be >= 1");
  Forest f;
  f.children.resize(static_cast<size_t>(n));
  f.own_bytes.resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const RecomputeItem& item = p.items[static_cast<size_t>(i)];
    if (item.act_bytes < 0 || item.out_bytes < 0 || item.cost_ms < 0)
      throw std::invalid_argument("recompute solver: item " + std::to_string(i) + " has a negative size or cost");
    if (item.parent >= i)
      throw std::invalid_argument("recompute solver: item " + std::to_string(i) + " comes before its parent " +
                                  std::to_string(item.parent));
    (item.parent < 0 ? f.roots : f.children[static_cast<size_t>(item.parent)]).push_back(i);
  }
  for (int i = 0; i < n; ++i) {
    int64_t inner = 0;
    for (int c : f.children[static_cast<size_t>(i)]) inner += p.items[static_cast<size_t>(c)].act_bytes;
    f.own_bytes[static_cast<size_t>(i)] = std::max<int64_t>(0, p.items[static_cast<size_t>(i)].act_bytes - inner);
  }
  return f;
}

int64_t kept_when_chosen(const RecomputeItem& item) {
  return std::min(item.out_bytes, item.act_bytes);
}

// ---- Evaluation: the plain simulation of the model, independent of the DP. ----

struct Timeline {
  int64_t kept = 0;  // held so far along the forward pass
  int64_t peak = 0;  // max over recomputations of kept-before + act
};

void walk(const RecomputeProblem& p, const Forest& f, const std::vector<char>& chosen, int i, Timeline& t) {
  const RecomputeItem& item = p.items[static_cast<size_t>(i)];
  if (chosen[static_cast<size_t>(i)]) {
    t.peak = std::max(t.peak, t.kept + item.act_bytes);
    t.kept += kept_when_chosen(item);
    return;
  }
  for (int c : f.children[static_cast<size_t>(i)]) walk(p, f, chosen, c, t);
  t.kept += f.own_bytes[static_cast<size_t>(i)];
}

// ---- DP ----

struct Choice {
  int item;
  std::shared_ptr<const Choice> next;
};

struct State {
  int64_t kept;  // quanta
  double cost;
  std::shared_ptr<const Choice> chosen;
};

using States = std::vector<State>;

// Sorts by kept bytes and keeps a state only when it is strictly cheaper than every state that keeps fewer bytes.
States pareto(States s) {
  std::sort(s.begin(), s.end(),
            [](const State& a, const State& b) { return a.kept != b.kept ? a.kept < b.kept : a.cost < b.cost; });
  States out;
  double best = std::numeric_limits<double>::infinity();
  for (State& st : s) {
    if (st.cost < best) {
      best = st.cost;
      out.push_back(std::move(st));
    }
  }
  return out;
}

int64_t quanta(int64_t bytes, int64_t quantum) {
  return bytes / quantum + (bytes % quantum != 0 ? 1 : 0);
}

class Dp {
 public:
  Dp(const RecomputeProblem& p, const Forest& f) : p_(p), f_(f), limit_(p.budget_bytes / p.quantum_bytes) {}

  States run(const std::vector<int>& items, States states) const {
    for (int i : items) {
      states = item(i, states);
      if (states.empty()) break;
    }
    return states;
  }

 private:
  States item(int i, const States& in) const {
    const RecomputeItem& it = p_.items[static_cast<size_t>(i)];
    const int64_t q = p_.quantum_bytes;
    States out;
    if (it.allowed) {
      const int64_t act = quanta(it.act_bytes, q), kept = quanta(kept_when_chosen(it), q);
      for (const State& s : in) {
        if (s.kept + act > limit_) continue;
        out.push_back({s.kept + kept, s.cost + it.cost_ms, std::make_shared<const Choice>(Choice{i, s.chosen})});
      }
    }
    if (!it.forced) {
      States through = run(f_.children[static_cast<size_t>(i)], in);
      const int64_t own = quanta(f_.own_bytes[static_cast<size_t>(i)], q);
      for (State& s : through) {
        s.kept += own;
        if (s.kept <= limit_) out.push_back(std::move(s));
      }
    }
    return pareto(std::move(out));
  }

  const RecomputeProblem& p_;
  const Forest& f_;
  int64_t limit_;
};

RecomputeEvaluation evaluate(const RecomputeProblem& problem, const Forest& f, const std::vector<int>& chosen) {
  const size_t n = problem.items.size();
  std::vector<char> is_chosen(n, 0);
  RecomputeEvaluation e;
  for (int i : chosen) {
    if (i < 0 || static_cast<size_t>(i) >= n || is_chosen[static_cast<size_t>(i)]) return e;
    is_chosen[static_cast<size_t>(i)] = 1;
  }
  for (size_t i = 0; i < n; ++i) {
    const RecomputeItem& item = problem.items[i];
    bool covered_above = false;
    for (int a = item.parent; a >= 0; a = problem.items[static_cast<size_t>(a)].parent)
      covered_above = covered_above || is_chosen[static_cast<size_t>(a)];
    if (is_chosen[i] && (covered_above || !item.allowed)) return e;
    if (item.forced && !is_chosen[i] && !covered_above) return e;
    if (is_chosen[i]) e.cost_ms += item.cost_ms;
  }
  Timeline t;
  for (int r : f.roots) walk(problem, f, is_chosen, r, t);
  e.valid = true;
  e.peak_bytes = std::max(t.kept, t.peak);
  return e;
}

}  // namespace

RecomputeEvaluation evaluate_recompute(const RecomputeProblem& problem, const std::vector<int>& chosen) {
  return evaluate(problem, build_forest(problem), chosen);
}

RecomputeFrontier solve_recompute(const RecomputeProblem& problem) {
  const Forest f = build_forest(problem);
  RecomputeFrontier result;
  if (problem.budget_bytes < 0) return result;
  const States final_states = Dp(problem, f).run(f.roots, States{State{0, 0.0, nullptr}});
  for (const State& s : final_states) {
    RecomputeSolution sol;
    for (const Choice* c = s.chosen.get(); c; c = c->next.get()) sol.chosen.push_back(c->item);
    std::sort(sol.chosen.begin(), sol.chosen.end());
    const RecomputeEvaluation e = evaluate(problem, f, sol.chosen);
    sol.feasible = e.valid && e.peak_bytes <= problem.budget_bytes;
    sol.cost_ms = e.cost_ms;
    sol.peak_bytes = e.peak_bytes;
    if (!sol.feasible) continue;  // cannot happen (rounding is conservative); kept as a guard
    result.frontier.push_back(std::move(sol));
  }
  // Best: least cost; ties go to the smaller peak. Frontier: Pareto in (exact peak, cost).
  std::sort(result.frontier.begin(), result.frontier.end(), [](const RecomputeSolution& a, const RecomputeSolution& b) {
    return a.peak_bytes != b.peak_bytes ? a.peak_bytes < b.peak_bytes : a.cost_ms < b.cost_ms;
  });
  std::vector<RecomputeSolution> pareto_front;
  double best_cost = std::numeric_limits<double>::infinity();
  for (RecomputeSolution& s : result.frontier) {
    if (s.cost_ms < best_cost) {
      best_cost = s.cost_ms;
      pareto_front.push_back(std::move(s));
    }
  }
  result.frontier = std::move(pareto_front);
  if (!result.frontier.empty()) result.best = result.frontier.back();
  return result;
}

}  // namespace vlatune::tuner
