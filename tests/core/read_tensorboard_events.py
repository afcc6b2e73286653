"""Reads a directory of TensorBoard event files with TensorBoard's own loader (EventAccumulator: the reader behind
`tensorboard --logdir`, which checks every record's CRCs and drops what a restart's session log orphans) and prints
{"scalars": {tag: [[step, value, wall_time], ...]}, "file_versions": [...]} as one JSON line."""
import json
import sys

from tensorboard.backend.event_processing import event_accumulator


def main() -> None:
    acc = event_accumulator.EventAccumulator(sys.argv[1], size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    scalars = {
        tag: [[e.step, e.value, e.wall_time] for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]
    }
    print(json.dumps({"scalars": scalars, "file_version": acc.file_version}))


if __name__ == "__main__":
    main()
