"""Run-ahead: a replayed step's programs start while the rest of the step is still recorded.

A training loop that waits for each whole step before it records the next (`deferfuse.sync()`,
`torch.tpu.synchronize()`, a value that only the step's last programs make) paid, step after
step, the host's recording and then the device's run, where Strict, dispatching op by op,
overlaps the two: on a device-bound model DeferAndFuse was then slower than Strict. (`loss.item()`
alone waits only for the program that makes the loss, so the device's backward pass already
overlapped the next step's recording.) When a step replays its trace (executors/replay.py), its
pending graph is, node for node, the graph that the same segment of the same kind of step flushed
last time. Once that flush has run the same plan twice in a row, the plan's programs are launched
(asynchronously, in the plan's order) as soon as the replay has recorded the last node each one
computes, and the flush runs only the rest. A plan of more than one program is what makes this
pay: a model whose layers repeat is cut into a program per layer (the fuser's blocks), so the
device runs the first layers while the host records the last.

Nothing here can change a value. A launched program reads graph inputs and scalars at positions
that never change once recorded, and the outputs of the programs launched before it. The flush
uses what was launched only when its own key finds the very plan launched from, so that the graph
it flushes is the one the plan was built for; otherwise it runs its plan from the graph's inputs
as if nothing had run. A launch donates no graph input (only values it made itself and reads for
the last time), so that fallback always has them, and it uses only program variants already
compiled, so it never compiles.
"""
from __future__ import annotations

from .. import events, spmd
from ..config import CONFIG
from ..events import METRICS
from ..target import jax_device
from .runtime import run_compiled

_CONFIRMED = 2  # flushes of a segment in a row with one plan before its programs run ahead
_MAX_SITES = 256


class Ahead:
    """A graph's run-ahead: the plan launched from (None while only learning which plan its
    flush runs), the values its launched programs made, and how many of its steps ran."""

    __slots__ = ("site", "plan", "env", "done", "ready", "held")

    def __init__(self, site, plan):
        self.site = site
        self.plan = plan
        self.env: dict = {}
        self.done = 0
        # the last launched step's outputs, held while the next step starts as the flush's loop
        # holds them (plans.Plan._run): a program then donates what it donates in the flush, in a
        # variant already compiled
        self.held = None
        # the graph length at which the next step's nodes are all recorded (None: launch no more)
        self.ready = None if plan is None else _ready(plan, 0)


# site -> (the plan its last flush ran, how many flushes in a row ran it)
_SEEN: dict = {}


def begin(g, site) -> None:
    """g is a new graph that replays (or traces) the segment of a step named by `site`."""
    if g.sources is not None or g.before is not None or not _on():
        g.ahead = None
        return
    seen = _SEEN.get(site)
    plan = seen[0] if seen is not None and seen[1] >= _CONFIRMED and _usable(seen[0]) else None
    g.ahead = Ahead(site, plan)


def recorded(g) -> None:
    """A replayed op recorded its nodes into g: launch the plan's next steps whose nodes are all
    recorded now."""
    a = g.ahead
    n = len(g.nodes)
    if a.ready is None or a.ready > n:
        return
    steps = a.plan.steps
    env, inputs, scalars = a.env, g.inputs, g.scalars
    try:
        while a.ready is not None and a.ready <= n:
            step = steps[a.done]
            grp, dies = step.group, step.dies
            ins = [inputs[-r - 1] if r < 0 else env[r] for r in grp.in_refs]
            last = [k for k, r in enumerate(grp.in_refs) if r >= 0 and k in dies]
            for k in last:  # read for the last time: the program may reuse its buffer
                del env[grp.in_refs[k]]
            outs = run_compiled(step.fn, ins, [scalars[i] for i in step.scalar_ids], last)
            if outs is None:  # no variant of the program compiled that may run now: the flush runs the rest
                for k in last:
                    env[grp.in_refs[k]] = ins[k]
                a.ready = None
                return
            for r, o in zip(grp.out_refs, outs):
                env[r] = o
            a.held = outs
            a.done += 1
            a.ready = _ready(a.plan, a.done)
            METRICS.execute_calls += 1
            METRICS.programs_ran_ahead += 1
    except Exception as exc:  # noqa: BLE001 - the flush runs the program again and reports its failure as usual
        # a value read for the last time may have left env with the program that failed to
        # start: the flush runs the whole plan from the graph's inputs, which launches never donate
        g.ahead = None
        events.emit("run_ahead_stop", error=f"{type(exc).__name__}: {str(exc)[:200]}")
    except BaseException:  # an interrupt: the op that launched raises it, its step left as above
        g.ahead = None
        raise


def take(g, plan) -> tuple[dict, int] | None:
    """At g's flush, which runs `plan`: the values its launched steps made and how many ran, if
    they ran from this plan (None: run it all). Learns which plan the segment's flush runs."""
    a = g.ahead
    if a is None:
        return None
    g.ahead = None
    seen = _SEEN.get(a.site)
    if len(_SEEN) >= _MAX_SITES and seen is None:
        _SEEN.clear()
    _SEEN[a.site] = (plan, seen[1] + 1 if seen is not None and seen[0] is plan else 1)
    if a.done and a.plan is plan:
        return a.env, a.done
    if a.done:
        METRICS.programs_ran_ahead_wasted += a.done
    return None


def forget() -> None:
    """Plans are gone (the cache was emptied): nothing runs ahead until a segment's flushes confirm
    one again."""
    _SEEN.clear()


def _on() -> bool:
    on = CONFIG.run_ahead
    return jax_device().platform != "cpu" if on == "auto" else on


def _usable(plan) -> bool:
    """A plan whose first program can run before the flush: more than one program (the one
    program of a whole-step plan needs every node), and no host step first."""
    return plan.single is None and plan.fills is None and len(plan.steps) > 1 and _launchable(plan.steps[0])


def _launchable(step) -> bool:
    # a host step (a CPU fallback) reads values on the host; a program holding collectives runs
    # on every process of its group, which all flush it in order
    return step.fn is not None and not isinstance(step.fn.fn, spmd.SpmdProgram)


def _ready(plan, done: int):
    if done >= len(plan.steps) or not _launchable(plan.steps[done]):
        return None
    return max(plan.steps[done].group.nodes) + 1
