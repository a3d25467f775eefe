"""Scoring the shoot-out: what a calculator claims (:class:`CalculatorResult`, component by component, with the
reason for each component it does not claim), and the tables built from :func:`memlab.studies.calculators.shoot_out`'s
long table: signed errors (:func:`error_table`), what each tool was scored on (:func:`scope_table`) and memlab's
in-sample / held-out split (:func:`held_out_table`). A component a tool does not claim on a run is "out of scope",
never an error."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from memlab.predict.families.reader import SUPPORTED, from_hf

if TYPE_CHECKING:
    from collections.abc import Iterable

    import pandas as pd

COMPONENTS = ("states", "activations", "states + activations", "peak")
"""What a tool can claim: model states (parameters + gradients + optimizer states, master weights included), the
bytes saved for backward, their sum, and the peak inside the step ("will it fit" is a question about the peak)."""

OUT_OF_SCOPE = "out of scope"


@dataclass(frozen=True)
class CalculatorResult:
    """A calculator's prediction for one run, in bytes. None: the tool claims no number for that component on this
    run; ``out_of_scope`` says why, per component (it models no such term, or assumes another recipe), so the cell
    reads "out of scope", never an error."""

    tool: str
    states: float | None
    activations: float | None
    available: bool = True
    note: str = ""
    peak: float | None = None
    out_of_scope: tuple[tuple[str, str], ...] = ()
    """(component, reason) for each component the tool does not claim on this run."""

    @property
    def total(self) -> float | None:
        """states + activations, only where the tool claims both (a tool without an activation model has none)."""
        if self.states is None or self.activations is None:
            return None
        return self.states + self.activations

    def claim(self, component: str) -> float | None:
        """The number claimed for ``component`` (one of :data:`COMPONENTS`), or None."""
        return {"states": self.states, "activations": self.activations, "states + activations": self.total,
                "peak": self.peak}[component]

    def reason(self, component: str) -> str:
        """Why ``component`` has no number: the tool's out-of-scope reason, or the note (unavailable tools)."""
        if not self.available:
            return self.note
        why = dict(self.out_of_scope)
        if component == "states + activations" and component not in why:
            return why.get("activations") or why.get("states") or "no number for one of the two"
        return why.get(component, "not modelled")

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "total": self.total}


def scoped(tool: str, claims: dict[str, float | None], reasons: dict[str, str], note: str = "") -> CalculatorResult:
    """A result claiming ``claims`` (component -> bytes); every component left out gets its reason from
    ``reasons`` (component -> why it is out of scope)."""
    out = tuple((c, reasons.get(c, "not modelled")) for c in ("states", "activations", "peak")
                if claims.get(c) is None)
    return CalculatorResult(tool, claims.get("states"), claims.get("activations"), note=note,
                            peak=claims.get("peak"), out_of_scope=out)


def error_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per tool and component: the signed median error and the signed worst error (largest magnitude), as
    fractions, over the rows in the tool's scope, and how many runs were scored; "out of scope" / "unavailable"
    where the tool has no number for any run (never an error)."""
    import pandas as pd

    comps = [c for c in COMPONENTS if c in set(frame["component"])]
    out = []
    for tool, g in frame.groupby("tool", sort=False):
        row: dict[str, Any] = {"tool": tool}
        for comp in comps:
            e = g[g["component"] == comp]["rel_error"].dropna().astype(float)
            if e.empty:
                row[f"{comp} median"] = row[f"{comp} worst"] = (
                    "unavailable" if not g["available"].all() else OUT_OF_SCOPE)
                row[f"{comp} runs"] = 0
                continue
            row[f"{comp} median"] = float(e.median())
            row[f"{comp} worst"] = float(e.loc[e.abs().idxmax()])
            row[f"{comp} runs"] = len(e)
        out.append(row)
    return pd.DataFrame(out)


def scope_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per tool and component, what it is scored on: the recipes of its scored runs, or "out of scope" with the
    reason(s) it gave (from :func:`memlab.studies.calculators.shoot_out`'s table)."""
    import pandas as pd

    comps = [c for c in COMPONENTS if c in set(frame["component"])]
    out = []
    for tool, g in frame.groupby("tool", sort=False):
        row: dict[str, Any] = {"tool": tool}
        for comp in comps:
            part = g[g["component"] == comp]
            scored = part[part["scope"] == "scored"]
            if len(scored):
                kinds = sorted(set(scored["recipe"] + (scored["recompute"] == "full").map({True: " ckpt",
                                                                                           False: ""})))
                row[comp] = f"scored on {len(scored)}: " + ", ".join(kinds)
            else:
                row[comp] = f"{OUT_OF_SCOPE}: " + "; ".join(dict.fromkeys(part["note"]))
        out.append(row)
    return pd.DataFrame(out)


def held_out_table(frame: pd.DataFrame, tested: dict[str, dict[str, Any]],
                   written_from: Iterable[str] | None = None, tool: str = "memlab") -> pd.DataFrame:
    """memlab's honesty table: per config (name and parameter count), whether its traits were written from that
    family (``written_from``: :data:`TRAITS_WRITTEN_FROM` by default) and whether the config itself is one the test
    suite checks the formula on (``tested``: name -> HF config), with ``tool``'s signed worst error per component
    on that config's runs."""
    import pandas as pd

    written = set(TRAITS_WRITTEN_FROM if written_from is None else written_from)
    tested_keys = {(name, from_hf(cfg).param_count()) for name, cfg in tested.items()}
    g = frame[(frame["tool"] == tool) & (frame["scope"] == "scored")]
    out = []
    for (config, family, params), part in g.groupby(["config", "family", "parameters"], sort=False):
        kind = ("held-out family" if family not in written else
                "in-sample (traits written from it, tested)" if (config, params) in tested_keys else
                "held-out config (family's traits, size not in the tests)")
        row: dict[str, Any] = {"config": config, "family": family, "parameters": params, "sample": kind,
                               "truth": ", ".join(dict.fromkeys(part["truth"])), "runs": part["experiment"].nunique()}
        for comp in COMPONENTS:
            e = part[part["component"] == comp]["rel_error"].dropna().astype(float)
            row[f"{comp} worst"] = float(e.loc[e.abs().idxmax()]) if len(e) else None
        out.append(row)
    return pd.DataFrame(out).dropna(axis=1, how="all")


TRAITS_WRITTEN_FROM = SUPPORTED
"""The families whose Hugging Face modelling code memlab's implementation traits
(:func:`memlab.predict.families.reader.from_hf`)
were written from and tested on: every family :func:`from_hf` maps (the first eight before the shoot-out was built,
the newer eleven since, each with its own tests), so none of them is a held-out family; what stays held out is the
size (a published full config the tests do not run) and any family the formula does not map."""
