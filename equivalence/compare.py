"""`levels compare`: every component x every level, checked, then timed, in one report.

For each (component, level) the report holds the check results (every variant, at the
check size) and a profile (cold first call, steady-state forward and forward+backward,
peak GPU memory, achieved TFLOP/s and TB/s, and the break-even call count against
Level 1: how many calls before a compiler's start-up cost has paid for itself).
A level that cannot run here is a row marked skipped, with its reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

import levels
from levels.contract import COMPONENTS

from . import environment, specs
from .check import CheckResult, check_case, dtype_name, fresh_seed, resolve_dtype
from .profile import Profile, break_even_calls, profile


@dataclass
class Row:
    profile: Profile
    checks: list[CheckResult] = field(default_factory=list)
    break_even_calls: float | None = None

    @property
    def checked(self) -> str:
        statuses = {c.status for c in self.checks}
        if not statuses or statuses == {"skip"}:
            return "skip"
        return "pass" if statuses <= {"pass"} else "FAIL"

    def to_dict(self) -> dict:
        return {**self.profile.to_dict(), "check": self.checked,
                "checks": [c.to_dict() for c in self.checks],
                "break_even_calls_vs_native": self.break_even_calls}


def compare(components=None, level_names=None, dtype="float32", device=None, size=None,
            check_size="small", seed=None, on_step=None) -> dict:
    """Run the comparison; `on_step(description)` is called before each unit of work."""
    device = torch.device(device) if device else environment.default_device()
    size = size or ("bench" if device.type == "cuda" else "small")
    dtype = resolve_dtype(dtype)
    seed = fresh_seed() if seed is None else seed
    components = list(components or COMPONENTS)
    names = [levels.resolve(name).name for name in (level_names or levels.LEVEL_NAMES)]
    rows: list[Row] = []
    for comp in components:
        spec = specs.get(comp)
        native = None
        for name in names:
            if on_step:
                on_step(f"{comp} · {name}")
            row = Row(profile(comp, name, dtype, device, size, seed=seed))
            if row.profile.status != "skip":
                # an emulated level (Triton's interpreter) is checked at the size it can afford
                at = check_size
                if row.profile.status == "untimed":
                    at = "tiny"
                    row.profile.reason = f"checked at 'tiny', not timed: {row.profile.reason}"
                row.checks = [check_case(comp, name, dtype, device, at, variant, seed)
                              for variant in spec.variants]
            if name == "native":
                native = row.profile
            elif native is not None:
                row.break_even_calls = break_even_calls(row.profile, native)
            rows.append(row)
    return {"environment": environment.describe(device),
            "settings": {"components": components, "levels": names, "dtype": dtype_name(dtype),
                         "device": str(device), "size": size, "check_size": check_size,
                         "seed": seed},
            "rows": [r.to_dict() for r in rows]}


def save(report: dict, out_dir) -> tuple[Path, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out / "compare.json", out / "compare.png"
    json_path.write_text(json.dumps(report, indent=2))
    plot(report, png_path)
    return json_path, png_path


def plot(report: dict, path) -> None:
    """One panel per component: steady-state fwd and fwd+bwd time per level (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    comps = report["settings"]["components"]
    names = report["settings"]["levels"]
    fig, axes = plt.subplots(1, len(comps), figsize=(3.2 * len(comps) + 1, 3.8), squeeze=False)
    for ax, comp in zip(axes[0], comps):
        rows = {r["level"]: r for r in report["rows"] if r["component"] == comp}
        xs = range(len(names))
        for offset, key, label in ((-0.2, "fwd", "forward"), (0.2, "fwd_bwd", "forward+backward")):
            heights = [rows[n][key]["median_ms"] if rows.get(n, {}).get(key) else 0 for n in names]
            ax.bar([x + offset for x in xs], heights, width=0.4, label=label)
        for x, n in zip(xs, names):
            r = rows.get(n)
            if r is None or r["status"] != "ok":
                label = {"skip": "skipped", "untimed": "checked, not timed"}.get(
                    r["status"] if r else "", "error")
                ax.text(x, 0.5, label,
                        rotation=90, ha="center", va="bottom", transform=ax.get_xaxis_transform(),
                        fontsize=8, color="gray")
            elif r["check"] == "FAIL":
                ax.text(x, 0.95, "check FAILED", rotation=90, ha="center", va="top",
                        transform=ax.get_xaxis_transform(), fontsize=8, color="red")
        ax.set_xticks(list(xs), [f"{levels.resolve(n).number} {n}" for n in names], rotation=45,
                      ha="right", fontsize=8)
        ax.set_yscale("log")
        times = [r[k]["median_ms"] for r in rows.values() for k in ("fwd", "fwd_bwd") if r.get(k)]
        if times:  # log-scale bars need a floor below the shortest one, or it looks like zero
            ax.set_ylim(min(times) / 3, max(times) * 2)
        ax.set_title(comp)
        ax.set_ylabel("median ms (log)")
    axes[0][0].legend(fontsize=8)
    s, env = report["settings"], report["environment"]
    where = env.get("gpu") or f"CPU ({env['cpu_threads']} threads)"
    fig.suptitle(f"levels compare — {s['dtype']}, size '{s['size']}', {where}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
