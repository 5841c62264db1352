"""Why prepacked linear layers pay (#33): one SmolLM2-shaped layer at a time, torch's ``F.linear`` (MKL) against
oneDNN on a prepacked weight, over 1 to 9 rows, with the weight in cache (warm) and pushed out by a 64 MB write
before every call (cold, as after a whole model's step); and the fixed cost of one ``PackedLinear`` call.

    python experiments/packed_linear/kernel_probes.py --output results/request-path/packed-linear/kernel_probes.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

#: (out, in) of SmolLM2-135M's layers: k/v, q/o, gate/up, down
SHAPES = ((192, 576), (576, 576), (1536, 576), (576, 1536))
ROWS = (1, 2, 4, 9)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=300, help="timed calls per cell (median)")
    parser.add_argument("--output", type=Path, default=None, help="write the figures here as JSON")
    args = parser.parse_args(argv)

    import torch
    import torch.nn.functional as F

    from dynvocab import pack_linear_layers

    flush = torch.zeros(16 * 1024 * 1024)  # 64 MB: more than this CPU's caches

    def microseconds(call, cold: bool) -> float:
        for _ in range(10):
            call()
        times = []
        for _ in range(args.repeats):
            if cold:
                flush.add_(1.0)
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        return round(1e6 * statistics.median(times), 1)

    torch.manual_seed(0)
    layers = {}
    with torch.no_grad():
        for out_features, in_features in SHAPES:
            weight = torch.randn(out_features, in_features)
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, 2)
            for rows in ROWS:
                x = torch.randn(1, rows, in_features)
                for cold in (False, True):
                    key = f"{out_features}x{in_features} rows={rows} {'cold' if cold else 'warm'}"
                    layers[key] = {
                        "mkl_us": microseconds(lambda: F.linear(x, weight), cold),
                        "onednn_packed_us": microseconds(
                            lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""), cold
                        ),
                    }
        tiny = torch.nn.Linear(8, 8)
        x = torch.randn(1, 1, 8)
        raw = torch.ops.mkldnn._reorder_linear_weight(tiny.weight.detach(), 2)
        overhead = {"F.linear_us": microseconds(lambda: F.linear(x, tiny.weight, tiny.bias), False),
                    "onednn_op_us": microseconds(
                        lambda: torch.ops.mkldnn._linear_pointwise(x, raw, tiny.bias, "none", [], ""), False)}
        pack_linear_layers(tiny)
        overhead["PackedLinear_us"] = microseconds(lambda: tiny(x), False)
    figures = {"threads": torch.get_num_threads(), "layers": layers, "fixed_cost_8x8": overhead}
    print(json.dumps(figures, indent=1))
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
    return figures


if __name__ == "__main__":
    main()
