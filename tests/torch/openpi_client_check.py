"""Drives `vlatune serve` with openpi's own client (openpi-client's WebsocketClientPolicy).

Run by tests/torch/test_serve_policy_server.cpp.

Usage: openpi_client_check.py PORT OBS_DIR
OBS_DIR holds what the C++ test wrote: image0.u8 and image1.u8 (HWC bytes), state.f64, noise.f32 and obs.json
(their shapes and the prompt). Prints one JSON object: the metadata, the actions of a good observation (twice, on
two connections open at once), and the error text of each bad observation sent between them on one connection.
"""

import json
import pathlib
import sys

import numpy as np
from openpi_client import websocket_client_policy


def main() -> None:
    port = int(sys.argv[1])
    obs_dir = pathlib.Path(sys.argv[2])
    spec = json.loads((obs_dir / "obs.json").read_text())

    def load(name, dtype, shape):
        return np.fromfile(obs_dir / name, dtype=dtype).reshape(shape)

    good = {
        "observation/image": load("image0.u8", np.uint8, spec["image0"]),
        "observation/wrist_image": load("image1.u8", np.uint8, spec["image1"]),
        "observation/state": load("state.f64", np.float64, spec["state"]),
        "prompt": spec["prompt"],
        "noise": load("noise.f32", np.float32, spec["noise"]),
    }
    out = {}
    first = websocket_client_policy.WebsocketClientPolicy(host="127.0.0.1", port=port)
    second = websocket_client_policy.WebsocketClientPolicy(host="127.0.0.1", port=port)  # a second client
    out["metadata"] = first.get_server_metadata()
    out["metadata_second"] = second.get_server_metadata()

    def infer(policy, obs):
        result = policy.infer(obs)
        actions = result["actions"]
        return {
            "actions": actions.tolist(),
            "shape": list(actions.shape),
            "dtype": str(actions.dtype),
            "policy_timing": sorted(result.get("policy_timing", {})),
            "server_timing": sorted(result.get("server_timing", {})),
        }

    out["good"] = infer(first, good)

    bad = {
        "missing_wrist": {k: v for k, v in good.items() if k != "observation/wrist_image"},
        "int64_image": dict(good, **{"observation/image": good["observation/image"].astype(np.int64)}),
        "state_shape": dict(good, **{"observation/state": good["observation/state"][:3]}),
        "prompt_type": dict(good, **{"prompt": 7}),
        "oversize": dict(good, **{"observation/image": np.zeros((200, 200, 3), np.uint8)}),
    }
    out["errors"] = {}
    for name, obs in bad.items():
        try:
            first.infer(obs)
            out["errors"][name] = None
        except RuntimeError as e:  # openpi-client raises a text reply as RuntimeError
            out["errors"][name] = str(e)

    out["good_again"] = infer(first, good)  # the connection that saw the errors still serves
    out["good_second"] = infer(second, good)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
