// The recompute selection as an exact optimization (anchors §3.4, AutoSAC's module-level formulation, solved by
// dynamic programming instead of a MILP): choose modules to recompute, none inside another, so that the added
// time is least while the activation peak stays within a budget.
//
// Memory model (evaluate_recompute, shared by the solver and the brute-force tests). Items form a forest in
// forward order (parents before children, siblings in the order they run). The forward pass is a sequence of
// segments: a chosen item is one segment that keeps only its output (out_bytes) until its backward, where the
// recomputation brings its whole activation (act_bytes) back; an item not chosen is its children's segments
// followed by its own part (act_bytes minus its children's act_bytes), kept whole. The backward visits the
// segments in reverse, freeing each one, so
//   peak = max( sum of kept bytes over all segments,
//               max over chosen segments k of (kept bytes of the segments before k) + act_bytes of k ).
// The first term is the end of the forward pass; the second is the recomputation of k on top of what is still
// held when its backward runs.
//
// Solver: a DP over the forest in forward order whose states are (kept bytes so far, added ms, choice), pruned to
// the Pareto frontier (fewer kept bytes or less time). The constraints only ever ask "kept so far + something <=
// budget" and kept bytes only grow, so a dominated state can never lead to a better completion: the result is
// exact. Sizes are counted in quanta of `quantum_bytes`, each segment rounded up, so a solution is always feasible
// in exact bytes and optimal for the rounded sizes (quantum 1 = exact; the planner uses 1 MiB). States are at
// most budget / quantum per item: O(items x budget/quantum) time, independent of the number of subsets.
#pragma once

#include <cstdint>
#include <vector>

namespace vlatune::tuner {

struct RecomputeItem {
  int parent = -1;        // index of the enclosing item; -1 for a root
  int64_t act_bytes = 0;  // held from its forward to its backward when not recomputed (inclusive of children)
  int64_t out_bytes = 0;  // held when recomputed (its output, kept by its consumers)
  double cost_ms = 0;     // time added to the step when recomputed
  bool allowed = true;    // may be chosen
  bool forced = false;    // must be chosen unless an ancestor is (its activation size is unknown)
};

struct RecomputeProblem {
  std::vector<RecomputeItem> items;  // parents before children; siblings in forward order
  int64_t budget_bytes = 0;          // bound on the activation peak (model above)
  int64_t quantum_bytes = 1;         // >= 1
};

struct RecomputeEvaluation {
  bool valid = false;  // no item nested in another chosen one, every forced item covered, only allowed items
  double cost_ms = 0;
  int64_t peak_bytes = 0;
};

// The model above for one selection (item indices, any order).
RecomputeEvaluation evaluate_recompute(const RecomputeProblem& problem, const std::vector<int>& chosen);

struct RecomputeSolution {
  bool feasible = false;
  std::vector<int> chosen;  // ascending item indices
  double cost_ms = 0;
  int64_t peak_bytes = 0;  // evaluate_recompute of `chosen`, exact bytes
};

struct RecomputeFrontier {
  RecomputeSolution best;                   // least cost within the budget (ties: least kept bytes)
  std::vector<RecomputeSolution> frontier;  // every final Pareto state, ascending peak, descending cost
};

// Throws std::invalid_argument for a malformed problem (parent after child, quantum < 1, negative sizes).
RecomputeFrontier solve_recompute(const RecomputeProblem& problem);

}  // namespace vlatune::tuner
