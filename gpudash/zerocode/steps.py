"""What ``gpudash run``'s agent uses once a script trains (imported with the Monitor, never at torch import).

- :class:`Session`: the recording itself: what a step is (optimizer steps, else backward calls), its
  phases, loss, samples, evaluations, and why a run without a step has none.

- :class:`Watched`: the model as ``CategoryCollector`` reads it, growing as the agent meets the
  script's root modules and optimizers (parameters, frozen ones included; optimizer state).
- :class:`GradMarks`: whether the gradients were reset (set to None, zeroed, replaced) since the last
  ``backward()``: without a ``torch.optim`` optimizer that is where one step ends and the next begins,
  and micro-batches that accumulate into the same gradients stay one step.

Evaluations and generation between steps: ``evals.py``; a forward's samples and tokens: ``inputs.py``.
"""

from __future__ import annotations

import weakref
from collections import ChainMap
from typing import Any

from gpudash.zerocode.evals import Evaluations
from gpudash.zerocode.inputs import samples_tokens

__all__ = ["STEPS_FROM_BACKWARD", "STEPS_FROM_OPTIMIZER", "GradMarks", "Session", "Watched"]

STEPS_FROM_OPTIMIZER = ("optimizer steps: a step is one step of the first torch.optim optimizer seen stepping "
                        "(its micro-batches included)")
STEPS_FROM_BACKWARD = ("backward() calls: no torch.optim optimizer stepped, so a step is one backward() of a loss "
                       "and the update after it (backward calls that accumulate into the same gradients are one step)")
#: gradients sampled per backward to tell accumulation from a new step
_MARKS = 4


class Watched:
    """The script's model as ``CategoryCollector`` reads it: the parameters of the root modules seen
    (frozen ones included) and of the optimizers seen, each once; the primary root's children for
    activations; the optimizers' states as one mapping."""

    def __init__(self) -> None:
        self._roots: list[Any] = []  # weakrefs, in the order seen
        self._optimizers: list[Any] = []  # weakrefs
        self._params: list[Any] | None = None  # cached until a root or optimizer is added
        self.state: ChainMap[Any, Any] = ChainMap()

    def add_root(self, module: Any) -> bool:
        """True when ``module`` is new (the caller refreshes the collector)."""
        if any(r() is module for r in self._roots):
            return False
        self._roots.append(weakref.ref(module))
        self._params = None
        return True

    def add_optimizer(self, optimizer: Any) -> bool:
        if any(r() is optimizer for r in self._optimizers):
            return False
        # optimizers gone since (a script that makes a new one every epoch) are forgotten, and their states
        # with them: the mapping held every state it was given, and its tensors, for the whole run
        self._optimizers = [r for r in self._optimizers if r() is not None]
        self._optimizers.append(weakref.ref(optimizer))
        self.state = ChainMap(*[o.state for o in (r() for r in self._optimizers) if o is not None])
        self._params = None
        return True

    def parameters(self) -> list[Any]:
        if self._params is not None:
            return self._params
        seen: dict[int, Any] = {}
        for r in self._roots:
            module = r()
            if module is not None:
                for p in module.parameters():
                    seen.setdefault(id(p), p)
        for r in self._optimizers:
            opt = r()
            if opt is not None:
                for group in opt.param_groups:
                    for p in group["params"]:
                        seen.setdefault(id(p), p)
        self._params = list(seen.values())
        return self._params

    def named_children(self) -> Any:
        root = self._roots[0]() if self._roots else None
        return root.named_children() if root is not None else iter(())


class GradMarks:
    """A few gradients' identity and version after a ``backward()``; :meth:`reset` tells whether the
    script reset them since (``zero_grad()``, ``p.grad = None``, ``p.grad.zero_()``)."""

    def __init__(self) -> None:
        self._marks: list[tuple[Any, int, int]] = []  # (param weakref, id(grad), grad._version)

    def mark(self, params: list[Any]) -> None:
        again = []  # the params marked last time first: no walk past thousands of frozen ones per backward
        for ref, _, _ in self._marks:
            p = ref()
            g = None if p is None else p.grad
            if g is None:
                break
            again.append((ref, id(g), int(g._version)))
        if again and len(again) == len(self._marks):
            self._marks = again
            return
        marks = []
        for p in params:
            g = p.grad
            if g is not None:
                marks.append((weakref.ref(p), id(g), int(g._version)))
                if len(marks) == _MARKS:
                    break
        self._marks = marks

    def reset(self) -> bool:
        if not self._marks:
            return False
        for ref, gid, version in self._marks:
            p = ref()
            g = None if p is None else p.grad
            if g is None or id(g) != gid or int(g._version) != version:
                return True
        return False


def _snake(name: str) -> str:
    out = "".join(f"_{c.lower()}" if c.isupper() else c for c in name).strip("_")
    return "".join(c if c.isalnum() else "_" for c in out) or "model"


class _Iteration:
    """Which optimizer steps make one step (one iteration of the loop) and each one's losses.

    One optimizer: its steps. Several (a GAN's discriminator and generator): the iteration ends with the
    step of the one that steps last in it, learned from the first iteration: after the primary's first step
    the iteration waits for every other optimizer the script made over other parameters (one made over the
    same parameters, as SAM's base optimizer or a wrapper, is not waited for). One that never steps is
    given up when the primary steps again."""

    def __init__(self) -> None:
        self.last: Any = None  # weakref: the optimizer whose step ends an iteration, once known
        self.waiting: list[Any] | None = None  # weakrefs, during the first iteration
        self.previous: Any = None  # weakref: the optimizer that stepped last
        self.losses: dict[int, tuple[str, list[Any]]] = {}  # id(optimizer) -> (column, summed losses per step)
        self.names: dict[int, str] = {}

    def add_losses(self, optimizer: Any, group: list[Any], primary: Any, watched: Watched) -> None:
        if not group:
            return
        key = id(optimizer)
        name = self.names.get(key)
        if name is None:
            name = self.names[key] = "loss" if optimizer is primary else self._name(optimizer, watched)
        total = group[0] if len(group) == 1 else sum(group[1:], group[0])
        self.losses.setdefault(key, (name, []))[1].append(total)

    def _name(self, optimizer: Any, watched: Watched) -> str:
        """``loss_<model>``: the root module whose parameters it steps (``loss_generator``), else its order."""
        first = next((p for g in optimizer.param_groups for p in g["params"]), None)
        name = None
        for r in watched._roots:
            root = r()
            if root is not None and first is not None and any(p is first for p in root.parameters()):
                name = f"loss_{_snake(type(root).__name__)}"
                break
        taken = set(self.names.values())
        if name is None or name in taken or name in ("loss_scale", "loss_spike"):
            name = f"loss_opt{len(self.names) + 1}"
        return name

    def take_losses(self) -> list[tuple[str, list[Any]]]:
        out, self.losses = list(self.losses.values()), {}
        return out

    def overdue(self, optimizer: Any, primary: Any) -> bool:
        """The primary is about to step while the first iteration still waits: give up waiting."""
        if self.waiting is None or optimizer is not primary:
            return False
        self.waiting = None
        self.last = self.previous
        return True

    def stepped(self, optimizer: Any, primary: Any, constructed: Any) -> bool:
        """Whether this optimizer step ends the iteration."""
        self.previous = weakref.ref(optimizer)
        if self.last is not None:
            return self.last() is optimizer
        if self.waiting is None:
            if optimizer is not primary:
                return False
            mine = {id(p) for g in optimizer.param_groups for p in g["params"]}
            others = [o for o in constructed if o is not optimizer
                      and any(id(p) not in mine for g in o.param_groups for p in g["params"])]
            if not others:
                self.last = weakref.ref(optimizer)
                return True
            self.waiting = [weakref.ref(o) for o in others]
            return False
        self.waiting = [r for r in self.waiting if r() is not None and r() is not optimizer]
        if self.waiting:
            return False
        self.waiting = None
        self.last = weakref.ref(optimizer)
        return True


class Session:
    """One process's recording under ``gpudash run``: the Monitor, what a step is, and what each hook
    the agent installed means for it. Created by the agent when the script first trains or evaluates."""

    def __init__(self, monitor: Any, torch: Any) -> None:
        from gpudash.collectors.categories import CategoryCollector
        from gpudash.integrations._step import StepDriver

        self.monitor = monitor
        self.torch = torch
        self.watched = Watched()
        self.marks = GradMarks()
        o = monitor.options
        self.collector = CategoryCollector(self.watched, self.watched, memory_every=o.memory_every,
                                           activations_every=o.activations_every,
                                           activations_budget=o.activations_budget)
        monitor.add_collector(self.collector)  # before the first step opens: step 0 as a Monitor sees it
        self.driver = StepDriver(monitor, {})
        self.mode: str | None = None  # None until known, then "optimizer" or "backward"
        self.steps = 0
        self.backwards = 0  # backward() calls in the open step
        self.since_backward = (0, 0)  # samples, tokens of the forwards since the last backward
        self.evals = Evaluations(monitor, self.driver, torch.Tensor)
        self.no_steps: str | None = None  # why the run recorded no step, once finished without one
        self.failure: str | None = None  # why recording failed (the agent's), for that reason
        self.ambiguous = False
        self._root: Any = None  # weakref to the primary root module
        self._primary: Any = None  # weakref to the primary optimizer
        self.constructed: Any = ()  # the torch.optim optimizers the script made (the agent's WeakSet)
        self.iteration = _Iteration()
        self.group: list[Any] = []  # losses of the backward calls since the last optimizer step
        self.group_backwards = 0  # backward calls since the last optimizer step
        self.since_opt = (0, 0)  # samples, tokens of the forwards since the last optimizer step
        self.reeval = False  # the forwards and backwards now re-evaluate the loss (a closure's 2nd call, SAM)
        self.closure_calls = 0
        self.opt_depth = 0  # optimizer steps open (one nested in another is part of it)
        self._resets_unstepped = 0
        self._open_opt: Any = None  # weakref: the optimizer whose step is open
        self.driver.begin_step()

    # ---- what a step is ---------------------------------------------------------------------
    def _set_mode(self, mode: str) -> None:
        if self.mode != mode:
            self.mode = mode
            self.monitor.set_meta(steps_from=STEPS_FROM_OPTIMIZER if mode == "optimizer" else STEPS_FROM_BACKWARD)

    def end_step(self) -> None:
        """Close the open step and open the next. Its loss: without an optimizer the sum of what went to
        backward; with optimizers each one's (the losses of the backward calls before its step, summed):
        the primary's as ``loss``, every other's as ``loss_<its model>`` (a GAN's generator apart from its
        discriminator)."""
        d = self.driver
        if self.ambiguous:
            d.samples = d.tokens = 0
            self.ambiguous = False
        if self.mode == "optimizer":
            for name, sums in self.iteration.take_losses():
                d.log(**{name: sums[0] if len(sums) == 1 else sum(sums[1:], sums[0]) / len(sums)})
        else:
            for loss in self.group:
                d.add_loss(loss)
            self.group = []
        d.log_loss("sum")
        d.end_step()
        d.begin_step()
        self.backwards = 0
        self.steps += 1

    def _new_step_if_reset(self) -> None:
        """Without an optimizer: gradients reset since the last backward mean the last step is over."""
        if self.mode == "optimizer" or self.reeval or not self.backwards or not self.marks.reset():
            return
        if self.mode is None and any(True for _ in self.constructed) and not self._resets_unstepped:
            # an optimizer was made but has not stepped yet: gradients reset once before its first step are a
            # second pass of the same step (SAM's first_step(zero_grad=True)), not a step of their own
            self._resets_unstepped += 1
            self.reeval = True
            return
        self._set_mode("backward")
        d = self.driver
        moved = self.since_backward  # the forwards since the last backward belong to the new step
        d.samples -= moved[0]
        d.tokens -= moved[1]
        self.end_step()
        d.samples += moved[0]
        d.tokens += moved[1]

    def _see(self, module: Any) -> None:
        if self.watched.add_root(module):
            self.collector.refresh()

    # ---- forwards -----------------------------------------------------------------------------
    def _check_reeval(self) -> None:
        """With an optimizer: gradients reset since a backward of this optimizer step mean the loss is being
        evaluated again (SAM's second pass, a closure that zeroes them): not counted twice."""
        if self.mode == "optimizer" and self.group_backwards and not self.reeval and self.marks.reset():
            self.reeval = True

    def train_forward(self, module: Any) -> None:
        self.end_eval()
        self.evals.training()
        self._new_step_if_reset()
        self._check_reeval()
        d = self.driver
        if d.phase_name in (None, "update", "optimizer"):  # a closure's forward inside the step included
            d.phase("forward")
        root = self._root() if self._root is not None else None
        has_params = any(True for _ in module.parameters())
        if root is None and has_params:
            self._root = weakref.ref(module)
        if has_params:
            self._see(module)

    def train_forward_done(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """The forward returned: its samples and tokens (the primary root's, ``inputs.py``) count."""
        d = self.driver
        if d.phase_name == "forward":
            d.phase("optimizer" if self.opt_depth else None)
        root = self._root() if self._root is not None else None
        if module is not root or self.reeval:
            return
        samples, tokens = samples_tokens(module, args, kwargs)
        if samples is None:
            self.ambiguous = True
            return
        d.samples += samples
        d.tokens += tokens or 0
        s, t = self.since_backward
        self.since_backward = (s + samples, t + (tokens or 0))
        s, t = self.since_opt
        self.since_opt = (s + samples, t + (tokens or 0))

    def eval_forward(self) -> None:
        self.evals.forward()

    def eval_output(self, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        self.evals.output(args, kwargs, output)

    def loader_iter(self, loader: Any) -> None:
        self.evals.loader_iter(loader)

    def end_eval(self) -> None:
        """Training resumed: the evaluation is over; it evaluated the weights of the steps done (without an
        optimizer a step ends when the next begins: an evaluation after a backward and its update comes
        after that step)."""
        if self.evals.open:
            self.evals.end(self.monitor.step_index + (1 if self.mode != "optimizer" and self.backwards else 0))

    # ---- backward and the optimizer --------------------------------------------------------
    def before_backward(self, loss: Any) -> None:
        self.end_eval()
        self._new_step_if_reset()
        self._check_reeval()
        d = self.driver
        d.phase("backward")
        if not self.reeval and isinstance(loss, self.torch.Tensor) and loss.numel() == 1:
            self.group.append(loss.detach())

    def after_backward(self) -> None:
        d = self.driver
        if d.phase_name == "backward":
            d.phase("optimizer" if self.opt_depth else None)
        self.backwards += 1
        self.group_backwards += 1
        self.since_backward = (0, 0)
        self.marks.mark(self.watched.parameters())
        if self.mode == "backward":
            d.phase("update")  # the hand-written update that follows

    def closure_call(self) -> None:
        """The optimizer evaluates its closure (L-BFGS: up to ``max_eval`` times a step): the first call is the
        step's loss (what ``step()`` returns), the later ones re-evaluate it."""
        self.closure_calls += 1
        if self.closure_calls > 1:
            self.reeval = True

    def optimizer_pre(self, optimizer: Any) -> bool:
        """An optimizer step begins; False for one nested in another's step (SAM's base optimizer): part of it."""
        if self.opt_depth and self._open_opt is not None and self._open_opt() is optimizer:
            self.opt_depth = 0  # its last step raised before its post hook (an OOM the script retried)
        self.opt_depth += 1
        if self.opt_depth > 1:
            return False
        self._open_opt = weakref.ref(optimizer)
        self.end_eval()
        if self.watched.add_optimizer(optimizer):
            self.collector.refresh()
            if self._primary is None:
                self._primary = weakref.ref(optimizer)
                self._set_mode("optimizer")
        if self.iteration.overdue(optimizer, self._primary()):
            self._end_early()
        self.closure_calls = 0
        self.driver.phase("optimizer")
        return True

    def optimizer_post(self, optimizer: Any) -> bool:
        """True when this ended a step (the iteration's last optimizer stepped)."""
        self.opt_depth = max(0, self.opt_depth - 1)
        if self.opt_depth:
            return False
        d = self.driver
        if d.phase_name == "optimizer":
            d.phase(None)
        primary = self._primary() if self._primary is not None else None
        self.iteration.add_losses(optimizer, self.group, primary, self.watched)
        self.group, self.group_backwards, self.since_opt = [], 0, (0, 0)
        self.reeval = False
        self._resets_unstepped = 0
        if primary is None:
            return False
        if optimizer is primary:
            groups = optimizer.param_groups
            if groups and "lr" in groups[0]:
                d.log(lr=groups[0]["lr"])
        if not self.iteration.stepped(optimizer, primary, self.constructed):
            return False
        self.end_step()
        return True

    def _end_early(self) -> None:
        """The primary optimizer steps again before an optimizer made alongside it ever stepped: the iteration
        ended at the last step; what ran since (its forwards and losses) belongs to the next one."""
        d = self.driver
        group, moved = self.group, self.since_opt
        self.group = []
        d.samples -= moved[0]
        d.tokens -= moved[1]
        self.end_step()
        d.samples += moved[0]
        d.tokens += moved[1]
        self.group = group

    def checkpoint(self, name: str | None) -> str | None:
        """Open ``name`` (``checkpoint`` around ``torch.save``, then what was open before); the phase it left."""
        d = self.driver
        before = d.phase_name
        if d.in_step:
            d.phase(name)
        return before

    # ---- the end -------------------------------------------------------------------------------
    def finish(self) -> None:
        """The script is done: close the open step the way its kind of step ends, and say why a run
        with no step has none."""
        self.end_eval()
        if self.mode != "optimizer" and self.backwards:
            self._set_mode("backward")
            self.end_step()  # no optimizer: the last backward (and its update) was a step
        self.driver.abandon()  # what ran after the last optimizer step is not a step
        if self.monitor.step_index == 0:
            if self.failure:
                why = f"recording failed: {self.failure}"
            elif self.evals.passes:
                gen = f", {self.evals.generations} generation(s)" if self.evals.generations else ""
                why = (f"no backward() ran: the script only evaluated ({self.evals.passes} evaluation pass(es){gen} "
                       "under no_grad or in eval mode); a step is one optimizer step, or one backward() without an "
                       "optimizer")
            else:
                why = ("no backward() and no optimizer step ran in this process: nothing trained that gpudash "
                       "run could see (a step is one optimizer step, or one backward() without an optimizer)")
            self.no_steps = why
            self.monitor.set_meta(no_steps_reason=why)
            self.monitor.event("no_steps", why)
