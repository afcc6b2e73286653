"""Opens a trace with Holistic Trace Analysis (HTA) as the README shows (argv[1]: the trace file, named as rank
0's trace in its directory, which may hold other JSON files such as profile.json), runs its temporal and GPU
kernel breakdowns, and prints one JSON line: {"temporal": [rows], "kernel_types": [rows], "kernels": [rows],
"iterations": [...], "warnings": [every warning HTA logged]}. Exit 0 when both breakdowns ran; a Python error
otherwise (the caller shows the traceback)."""
import json
import logging
import os
import sys


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.messages = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def main() -> None:
    from hta.configs.config import logger
    from hta.trace_analysis import TraceAnalysis

    collect = Collect()
    logger.addHandler(collect)
    trace_dir, trace_file = os.path.split(os.path.abspath(sys.argv[1]))
    analyzer = TraceAnalysis(trace_files={0: trace_file}, trace_dir=trace_dir)
    temporal = analyzer.get_temporal_breakdown(visualize=False)
    kernel_types, kernels = analyzer.get_gpu_kernel_breakdown(visualize=False)
    out = {
        "temporal": json.loads(temporal.to_json(orient="records")),
        "kernel_types": json.loads(kernel_types.to_json(orient="records")),
        "kernels": json.loads(kernels.to_json(orient="records")),
        "iterations": [int(i) for i in analyzer.t.get_iterations()],
        "warnings": collect.messages,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
