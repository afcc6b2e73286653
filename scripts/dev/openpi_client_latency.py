"""Round-trip latency of `vlatune serve` through openpi's client (openpi-client's WebsocketClientPolicy).

Usage: openpi_client_latency.py PORT REQUESTS [IMAGE_SIDE]
Sends REQUESTS LIBERO-shaped observations (two uint8 cameras of IMAGE_SIDE, default 224, an 8-d state, a prompt)
after 5 warm-up ones and prints one JSON object: the median, min and max round trip in ms (client side: pack,
send, server work, receive, unpack), and the medians of the server's own timing fields.
"""

import json
import statistics
import sys
import time

import numpy as np
from openpi_client import websocket_client_policy


def main() -> None:
    port = int(sys.argv[1])
    requests = int(sys.argv[2])
    side = int(sys.argv[3]) if len(sys.argv) > 3 else 224
    rng = np.random.default_rng(0)
    obs = {
        "observation/image": rng.integers(0, 256, (side, side, 3), dtype=np.uint8),
        "observation/wrist_image": rng.integers(0, 256, (side, side, 3), dtype=np.uint8),
        "observation/state": rng.random(8),
        "prompt": "put both the alphabet soup and the tomato sauce in the basket",
    }
    policy = websocket_client_policy.WebsocketClientPolicy(host="127.0.0.1", port=port)
    for _ in range(5):
        policy.infer(obs)
    round_trip, policy_ms, server_ms = [], [], []
    shape = None
    for _ in range(requests):
        t0 = time.perf_counter()
        result = policy.infer(obs)
        round_trip.append((time.perf_counter() - t0) * 1000)
        policy_ms.append(result["policy_timing"]["infer_ms"])
        server_ms.append(result["server_timing"]["infer_ms"])
        shape = list(result["actions"].shape)
    print(json.dumps({
        "requests": requests,
        "actions_shape": shape,
        "round_trip_ms_median": statistics.median(round_trip),
        "round_trip_ms_min": min(round_trip),
        "round_trip_ms_max": max(round_trip),
        "server_infer_ms_median": statistics.median(server_ms),
        "policy_infer_ms_median": statistics.median(policy_ms),
        "metadata": policy.get_server_metadata(),
    }))


if __name__ == "__main__":
    main()
