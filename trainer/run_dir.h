// A run directory belongs to one run (RUNDIR of `vlatune train --out` / `--resume`):
//   - the writing process (rank 0) holds an exclusive lock on RUNDIR/train.lock (flock) for the run's life, so a
//     second `train` on the same directory is refused at once, naming the holder's pid, instead of interleaving
//     its metrics with the first one's;
//   - a new run starts only in a directory that does not exist, is empty, or holds nothing but train.lock (what a
//     start refused before its first write leaves): anything else may be another run's or the user's data;
//   - a resumed run accepts only its own checkpoints: checkpoints/ must be a directory (not a link), and every
//     step_* entry in it must carry the run's run_id (formats/checkpoint_state.h);
//   - the temporaries a killed run leaves (checkpoints/.step_*.tmp, and FILE.tmp.* beside the files the trainer
//     writes) are removed when it resumes: only the files the trainer writes, never a file of the user's.
// Errors are TrainInputError (exit 4) naming the directory, the entry and what to do.
#pragma once

#include <string>
#include <vector>

namespace vlatune::trainer {

inline constexpr const char* kRunLockName = "train.lock";

class RunDirLock {
 public:
  // Creates `run_dir` when it does not exist, then takes the lock without waiting.
  explicit RunDirLock(const std::string& run_dir);
  ~RunDirLock();
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

 private:
  int fd_ = -1;
};

// 16 random lowercase hex digits: a run's identity (train_config.json's run_id).
std::string new_run_id();

// `path` made absolute against the working directory, as written (links are not resolved).
std::string absolute_path(const std::string& path);

// Refuses a directory that cannot take a new run, naming what is in it.
void check_new_run_dir(const std::string& dir);

// The checkpoint directories of run `run_id` in `run_dir`, oldest first; refuses a symlinked checkpoints/ and any
// step_* entry that is not one of the run's own checkpoints.
std::vector<std::string> own_checkpoints(const std::string& run_dir, const std::string& run_id);

// Removes the temporaries of interrupted writes; returns one line per removal (and per failure, as a warning).
std::vector<std::string> remove_leftover_temporaries(const std::string& run_dir);

}  // namespace vlatune::trainer
