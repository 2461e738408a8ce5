"""Backward passes of one stage: full (B), input gradients only (I), weight gradients later (W).

I/W split (zero-bubble style) without touching the user's model:

- I walks the autograd graph once. Nodes on a path from the stage outputs to a stage input form
  the *input path*. For each parameter, walking from its gradient accumulator towards the outputs
  stops at the first input-path nodes: those are its *intermediates* (e.g. the matmul that consumes
  both the activation and the weight). I computes the input gradients with the graph kept, and a
  pre-hook on each intermediate captures the gradient flowing into it.
- W replays only the weight branches: ``autograd.grad`` from the intermediates (seeded with the
  captured gradients) to the parameters, one call per group of parameters sharing intermediates.
  A pre-hook pins each intermediate's incoming gradient to the captured one, so a gradient that
  also flows from one intermediate to another in the same group is not counted twice.
- Parameters that no input path reaches (all of them on a first stage, whose inputs need no
  gradient) are *orphans*: W computes them from the stage outputs, i.e. a full backward for them.
- The job also lists the nodes W will execute, so that the caller can release, right after I,
  every saved activation only the input path needed (what makes W's memory smaller than B's).
- Each parameter's gradient accumulator (the ``AccumulateGrad`` node its edges end at) is found once
  and held (``GradAccumulators``, owned by the stage), as DDP holds them: finding it costs a
  ``view_as`` per parameter, which I and W would otherwise pay twice per microbatch.

Gradients are accumulated into ``param.grad`` exactly as ``AccumulateGrad`` does (assign, then add).
All passes call the autograd engine directly (what ``torch.autograd.backward``/``grad`` call after
their Python-side argument checks): that saves per-call overhead and a first-call import of sympy
that those checks trigger. The engine still validates gradient shapes against the graph.
"""
from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.autograd.graph import GradientEdge, Node, get_gradient_edge

Root = torch.Tensor | GradientEdge


try:
    from torch.autograd.graph import _engine_run_backward as _run_engine
except ImportError:  # pragma: no cover - older/newer torch: fall back on the public API
    _run_engine = None  # type: ignore[assignment]


def _engine(roots: Sequence[Root], grads: Sequence[torch.Tensor | None], inputs: Sequence[Any] = (),
            *, retain: bool = False, accumulate: bool = True) -> tuple:
    """Run the autograd engine from ``roots`` seeded with ``grads`` (None: ones, for a scalar loss)."""
    grads = [torch.ones_like(r) if g is None and isinstance(r, torch.Tensor) else g for r, g in zip(roots, grads)]
    if _run_engine is None:
        if accumulate:
            torch.autograd.backward(list(roots), grads, retain_graph=retain, inputs=list(inputs) or None)
            return ()
        return torch.autograd.grad(list(roots), list(inputs), grads, retain_graph=retain, allow_unused=True)
    return _run_engine(tuple(roots), tuple(grads), retain, False, tuple(inputs), True, accumulate)


def _edge(x: Root) -> GradientEdge:
    return x if isinstance(x, GradientEdge) else get_gradient_edge(x)


def backward_full(roots: Sequence[Root], grads: Sequence[torch.Tensor | None], inputs: Sequence[torch.Tensor]) -> list[torch.Tensor | None]:
    """B: accumulate parameter gradients and return the gradients of ``inputs`` (leaves)."""
    if roots:
        _engine(roots, grads)
    return [x.grad for x in inputs]


class GradAccumulators:
    """Each parameter's ``AccumulateGrad`` node, found once and held. Holding it keeps it the node
    autograd uses for that parameter in every later graph (a tensor refers to its accumulator only
    weakly and makes a new one when none is alive), so the cached edge stays the right one."""

    def __init__(self) -> None:
        self._nodes: dict[torch.nn.Parameter, Node] = {}

    def node(self, p: torch.nn.Parameter) -> Node:
        node = self._nodes.get(p)
        if node is None:
            node = self._nodes[p] = get_gradient_edge(p).node
        return node


@dataclass
class _Group:
    params: list[torch.nn.Parameter] = field(default_factory=list)
    targets: list[Node] = field(default_factory=list)  # the params' accumulators, in the same order
    nodes: list[Node] = field(default_factory=list)
    captured: list[Any] = field(default_factory=list)
    branch: set[Node] = field(default_factory=set)  # nodes between the parameters and the intermediates


@dataclass
class WeightJob:
    """What W needs after I: the parameter groups with their captured gradients, the orphans, and
    the graph nodes W will execute (None: all of them)."""

    groups: list[_Group]
    orphans: list[torch.nn.Parameter]
    roots: list[Root]
    grads: list[torch.Tensor | None]
    nodes: set[Node] | None = None

    def saved_by_needed_nodes(self, attr_cache: dict[str, tuple[str, ...]]) -> list[Any] | None:
        """What autograd packed for the nodes W executes (the store's handles), or None if W runs
        the whole graph. ``attr_cache`` maps node class names to their saved-tensor attributes."""
        if self.nodes is None:
            return None
        packed: list[Any] = []
        for node in self.nodes:
            name = type(node).__name__
            attrs = attr_cache.get(name)
            if attrs is None:
                attrs = attr_cache[name] = tuple(a for a in dir(node) if a.startswith("_raw_saved_"))
            for attr in attrs:
                saved = getattr(node, attr)
                for item in saved if isinstance(saved, (list, tuple)) else (saved,):
                    data = getattr(item, "data", None)
                    if data is not None:
                        packed.append(data)
        return packed


def _reverse_graph(roots: list[Node]) -> dict[Node, list[Node]]:
    """For each node reachable from ``roots``: the nodes that feed gradients into it."""
    parents: dict[Node, list[Node]] = defaultdict(list)
    seen = set(roots)
    queue = deque(roots)
    while queue:
        node = queue.popleft()
        for child, _ in node.next_functions:
            if child is None:
                continue
            parents[child].append(node)
            if child not in seen:
                seen.add(child)
                queue.append(child)
    for root in roots:
        parents.setdefault(root, [])
    return parents


def _upward(starts: list[Node], parents: dict[Node, list[Node]], stop: set[Node]) -> tuple[set[Node], set[Node], bool]:
    """Walk towards the outputs from ``starts``; return (visited, stop nodes hit, reached a root)."""
    visited: set[Node] = set()
    hit: set[Node] = set()
    reached_root = False
    queue = deque(n for n in starts if n in parents)
    visited.update(queue)
    while queue:
        node = queue.popleft()
        ups = parents[node]
        if not ups:
            reached_root = True
        for up in ups:
            if up in stop:
                hit.add(up)
            elif up not in visited:
                visited.add(up)
                queue.append(up)
    return visited, hit, reached_root


def _closure(starts: Sequence[Node], step: Any) -> set[Node]:
    seen = set(starts)
    queue = deque(seen)
    while queue:
        for nxt in step(queue.popleft()):
            if nxt is not None and nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return seen


def _needed_by_w(groups: list[_Group], orphans: list[Node], parents: dict[Node, list[Node]]) -> set[Node]:
    """Nodes W executes: on a path from a group's intermediates to its parameters, or (orphans) on
    any path from the outputs to an orphan parameter."""
    up = parents.__getitem__
    down = lambda n: (c for c, _ in n.next_functions)  # noqa: E731
    nodes: set[Node] = set()
    for group in groups:
        if len(group.nodes) == 1:
            # One intermediate: every path from it to the parameters runs through the weight branch
            # (leaving it anywhere else would reach another input-path node, i.e. another intermediate).
            nodes |= group.branch
            nodes.add(group.nodes[0])
            continue
        nodes |= _closure(group.targets, up) & _closure(group.nodes, down)
    if orphans:
        nodes |= _closure(orphans, up)
    return nodes


def _plan(roots: list[Root], inputs: Sequence[torch.Tensor], params: Sequence[torch.nn.Parameter],
          accumulators: GradAccumulators | None = None) -> tuple[list[_Group], list[torch.nn.Parameter], set[Node]]:
    accumulators = accumulators or GradAccumulators()
    root_nodes = [_edge(r).node for r in roots]
    parents = _reverse_graph(root_nodes)
    input_nodes = [_edge(x).node for x in inputs]
    input_path, _, _ = _upward(input_nodes, parents, set())
    groups_by_node: dict[Node, _Group] = {}
    orphans: list[torch.nn.Parameter] = []
    orphan_nodes: list[Node] = []
    for p in params:
        node = accumulators.node(p)
        if node not in parents:
            continue  # not used by this forward: no gradient
        branch, hit, reached_root = _upward([node], parents, input_path)
        if reached_root or not hit:
            orphans.append(p)
            orphan_nodes.append(node)
            continue
        merged = [groups_by_node[n] for n in hit if n in groups_by_node]
        group = merged[0] if merged else _Group()
        group.branch |= branch
        for other in merged[1:]:
            if other is group:
                continue
            group.params.extend(other.params)
            group.targets.extend(other.targets)
            group.branch |= other.branch
            for n in other.nodes:
                groups_by_node[n] = group
                if n not in group.nodes:
                    group.nodes.append(n)
        group.params.append(p)
        group.targets.append(node)
        for n in hit:
            if n not in group.nodes:
                group.nodes.append(n)
            groups_by_node[n] = group
    unique = list({id(g): g for g in groups_by_node.values()}.values())
    return unique, orphans, _needed_by_w(unique, orphan_nodes, parents)


def backward_input(
    roots: Sequence[Root], grads: Sequence[torch.Tensor | None], inputs: Sequence[torch.Tensor],
    params: Sequence[torch.nn.Parameter], accumulators: GradAccumulators | None = None,
) -> tuple[list[torch.Tensor | None], WeightJob]:
    """I: gradients of ``inputs`` only; returns them and the job W will run. ``accumulators``: the
    caller's cache of the parameters' accumulators (a fresh one per call without it)."""
    roots, grads = list(roots), list(grads)
    params = [p for p in params if p.requires_grad]
    if not inputs or not roots:
        return [None] * len(inputs), WeightJob([], params if roots else [], roots, grads)
    groups, orphans, needed = _plan(roots, inputs, params, accumulators)
    hooks = []
    try:
        for group in groups:
            group.captured = [None] * len(group.nodes)
            for i, node in enumerate(group.nodes):
                def capture(grad_outputs: Any, group: _Group = group, i: int = i) -> None:
                    group.captured[i] = grad_outputs
                hooks.append(node.register_prehook(capture))
        in_grads = _engine(roots, grads, inputs, retain=True, accumulate=False)
    finally:
        for h in hooks:
            h.remove()
    keep_roots = roots if orphans else []
    return list(in_grads), WeightJob(groups, orphans, keep_roots, grads if orphans else [], needed)


def _accumulate(params: Sequence[torch.nn.Parameter], dws: Sequence[torch.Tensor | None]) -> None:
    for p, dw in zip(params, dws):
        if dw is None:
            continue
        if p.grad is None:
            p.grad = dw
        else:
            p.grad += dw


def backward_weight(job: WeightJob) -> None:
    """W: parameter gradients from what I captured (and a full backward for the orphans)."""
    for group in job.groups:
        edges, seeds = [], []
        for node, grads in zip(group.nodes, group.captured):
            for i, g in enumerate(grads or ()):
                if g is not None:
                    edges.append(GradientEdge(node, i))
                    seeds.append(g)
        if not edges:
            continue
        hooks = []
        try:
            if len(group.nodes) > 1:
                for node, grads in zip(group.nodes, group.captured):
                    hooks.append(node.register_prehook(lambda _g, fixed=grads: fixed))
            targets = [GradientEdge(node, 0) for node in group.targets]
            # Keep the graph: groups may share input-path segments; it is freed with the last reference.
            dws = _engine(edges, seeds, targets, retain=True, accumulate=False)
        finally:
            for h in hooks:
                h.remove()
        _accumulate(group.params, dws)
    if job.orphans:
        dws = _engine(job.roots, job.grads, job.orphans, retain=True, accumulate=False)
        _accumulate(job.orphans, dws)
    job.groups.clear()
    job.roots.clear()
    job.grads.clear()
