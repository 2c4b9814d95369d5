"""What kind of loss feeds a backward: is it a token-level mean of each micro-batch (ACL308)?

Read off the loss's bindings in its function (and in the module's helper functions it calls).
A token mean is `F.cross_entropy` / `nn.CrossEntropyLoss()` (or `nll_loss`) with the default
reduction on flattened logits or with `ignore_index`, or `.loss` of a causal-LM, seq2seq,
masked-LM or token-classification model called with labels. A sum (`reduction="sum"` on the
loss, `loss_reduction="sum"` on the model, or `"none"` then `.sum()`), a mean re-weighted by its
token count, a model handed `num_items_in_batch=` and a sequence-level loss (classification
logits, not flattened) are not; a sum divided by its own micro-batch's token count is a mean.

Which logged values are a loss divided by K or scaled (ACL504) is `logged_losses.py`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from linter.model.cst_util import (
    code,
    dotted,
    keyword,
    last_part,
    method_call,
    positional,
    string_value,
    strip_parens,
    walk,
)
from linter.model.depths import LOSS_DEPTH
from linter.model.functions import Scope, Stmt
from linter.model.kinds import GateKind, LossTermKind
from linter.model.setup import is_prepare

if TYPE_CHECKING:
    from linter.model import Gate, Model, Site

_TOKEN_LOSS_FUNCTIONS = {"torch.nn.functional.cross_entropy", "torch.nn.functional.nll_loss"}
_TOKEN_LOSS_CLASSES = {"CrossEntropyLoss", "NLLLoss"}
# Heads whose `.loss` is a mean over the valid tokens of the batch.
_TOKEN_LEVEL_MODEL = re.compile(
    r"(ForCausalLM|LMHeadModel|ForSeq2SeqLM|ForConditionalGeneration|ForTokenClassification"
    r"|ForMaskedLM|WithLMHead|ForPreTraining|ForSpeechSeq2Seq)$"
)
_LOADERS = {"from_pretrained", "from_config", "_from_config"}
_WRAPPERS = {"to", "cuda", "cpu", "half", "float", "bfloat16", "train"}
_PASS_METHODS = {"mean", "float", "double", "half", "bfloat16", "to", "squeeze", "clone", "cuda"}
# A factor that turns a per-batch mean back into a sum: a token or item count of the batch.
_COUNT = re.compile(r"tok|item|count|mask|\.sum\(|numel|n_valid|valid", re.I)
_K_NAME = re.compile(r"grad(ient)?_?acc|accum", re.I)
_MAX_MODEL_DEPTH = 12  # a model is often rebound several times (load, adapter, compile, prepare)


@dataclass(frozen=True)
class TokenMean:
    """A token-level loss on the path to a backward: a mean, or a sum (`LossTermKind`)."""

    node: cst.CSTNode  # the loss call, or the `.loss` read of the model output
    what: str  # how the finding names it
    stmt: Stmt
    ignore_index: bool = False  # the loss itself skips some targets: counts vary by batch
    kind: LossTermKind = LossTermKind.MEAN
    call: cst.Call | None = None  # the loss or model call of a token sum


def token_means(model: Model, site: Site) -> list[TokenMean]:
    """The token-level means that flow into this backward's loss, when the number of valid
    tokens can differ between micro-batches: the loss names an `ignore_index`, or the module
    masks or pads labels (`-100`, a padding collator, `padding=`). Texts packed into blocks of
    one length (the HF `group_texts` scripts) give every micro-batch the same count: no bias."""
    loss = model.loss_expr(site)
    if loss is None:
        return []
    found = _TokenMeans(model).of(loss, site.stmt.scope, site.stmt.order, site.stmt, 0)
    found = [t for t in found if t.kind == LossTermKind.MEAN]
    if not model.memo("labels_may_be_masked", _labels_may_be_masked):
        found = [t for t in found if t.ignore_index]
    return found


_MASKING_KEYWORDS = {"ignore_index", "label_pad_token_id", "ignore_pad_token_for_loss", "padding"}
_MASKING_NAMES = re.compile(r"^(DataCollatorFor\w+|DataCollatorWithPadding|pad_sequence)$")


# What any of the masking spellings below needs in the text: a file without it is not walked.
_MASKING_TEXT = re.compile(
    r"ignore_index|label_pad_token_id|ignore_pad_token_for_loss|padding|100|DataCollator|pad_seq"
)


def _labels_may_be_masked(model: Model) -> bool:
    """Whether the module masks or pads labels anywhere (evidence that valid-token counts vary)."""
    if model.source is not None and not _MASKING_TEXT.search(model.source):
        return False
    return _names_any(model, _MASKING_KEYWORDS, minus_100=True)


def _names_any(model: Model, keywords, minus_100: bool = False) -> bool:
    """A keyword argument among `keywords`, a masking or padding name (`_MASKING_NAMES`), or,
    with `minus_100`, the literal `-100`, anywhere in the module."""
    for scope in model.scopes:
        for stmt in scope.stmts:
            for node in walk(stmt.node):
                kind = type(node)  # every node of the module: no isinstance, no dotted text
                if kind is cst.Arg and node.keyword is not None:
                    if node.keyword.value in keywords:
                        return True
                elif kind is cst.UnaryOperation and isinstance(node.operator, cst.Minus):
                    if minus_100 and isinstance(node.expression, cst.Integer):
                        if node.expression.value == "100":
                            return True
                elif kind is cst.Name or kind is cst.Attribute:
                    # the dotted text's last part, only built for a name that matches
                    last = node.value if kind is cst.Name else node.attr.value
                    if _MASKING_NAMES.match(last) and dotted(node) is not None:
                        return True
    return False


def accumulates(model: Model, gate: Gate | None) -> bool:
    """Whether the gate makes a window of more than one micro-batch: an `accumulate()` or
    `sync_gradients` gate with an engine K, a modulo/counter gate with K > 1 (or a K read at
    run time), or a micro-step loop."""
    if gate is None:
        return False
    if gate.kind in (GateKind.ACCUMULATE, GateKind.SYNC):
        k = gate.k if gate.k is not None else model.engine_k()
    elif gate.kind == GateKind.MICRO_LOOP:
        return gate.k is None or not _at_most_one(gate.k)
    else:
        k = gate.k
    return k is not None and not _at_most_one(k)


def _at_most_one(k: cst.BaseExpression) -> bool:
    return isinstance(k, cst.Integer) and int(k.value, 0) <= 1


class _TokenMeans:
    def __init__(self, model: Model) -> None:
        self.model = model
        self.seen: set[int] = set()

    def of(self, node, scope: Scope, order: int, stmt: Stmt, depth: int) -> list[TokenMean]:
        if depth > LOSS_DEPTH or id(node) in self.seen:
            return []
        self.seen.add(id(node))
        node = strip_parens(node)
        if isinstance(node, cst.BinaryOperation):
            return self._binary(node, scope, order, stmt, depth)
        if isinstance(node, cst.IfExp):
            arms = (node.body, node.orelse)
            return [t for a in arms for t in self.of(a, scope, order, stmt, depth + 1)]
        if isinstance(node, cst.UnaryOperation):
            return self.of(node.expression, scope, order, stmt, depth + 1)
        if isinstance(node, cst.Call):
            return self._call(node, scope, order, stmt, depth)
        if _reads_loss_field(node):
            return self._model_loss(node, scope, order, stmt, depth)
        text = dotted(node)
        if text is not None:
            return self._name(text, scope, order, depth)
        return []

    def _binary(self, node, scope, order, stmt, depth) -> list[TokenMean]:
        if isinstance(node.operator, (cst.Add, cst.Subtract)):
            sides = (node.left, node.right)
            return [t for s in sides for t in self.of(s, scope, order, stmt, depth + 1)]
        if isinstance(node.operator, cst.Multiply):
            if any(_COUNT.search(code(side)) for side in (node.left, node.right)):
                return []  # `mean * n_tokens / window_tokens`: re-weighted into a sum
            # factors are parts of this expression, not hops: `loss * K * W / n` costs no depth
            sides = (node.left, node.right)
            return [t for s in sides for t in self.of(s, scope, order, stmt, depth)]
        if isinstance(node.operator, (cst.Divide, cst.FloorDivide)):
            found = self.of(node.left, scope, order, stmt, depth)  # `/ K` keeps a mean
            return self._divided(found, node, node.right, scope, order, stmt)
        return []

    def _divided(self, found, node, divisor, scope, order, stmt) -> list[TokenMean]:
        """A token sum divided by the valid-token count of its own micro-batch is that
        micro-batch's mean again; divided by the window's count (or by K) it stays a sum."""
        sums = [t for t in found if t.kind == LossTermKind.SUM]
        if not sums or not _own_token_count(self.model, divisor, scope, order, sums):
            return found
        what = f"`{code(node)}` (a token sum divided by its own micro-batch's token count)"
        mean = TokenMean(node, what, stmt, any(t.ignore_index for t in sums))
        return [t for t in found if t.kind != LossTermKind.SUM] + [mean]

    def _name(self, text: str, scope: Scope, order: int, depth: int) -> list[TokenMean]:
        defs = scope.defs_before(text, order)
        if not defs:
            if text in scope.params:
                sites = self.model.argument_sites(scope, text)
                return [t for e, s in sites for t in self.of(e, s.scope, s.order, s, depth + 1)]
            return []
        d = defs[-1]
        if d.op == "=" and d.tuple_index is None:
            return self.of(d.value, d.stmt.scope, d.stmt.order, d.stmt, depth + 1)
        if d.op in ("/=", "*="):
            if d.op == "*=" and _COUNT.search(code(d.value)):
                return []
            found = self._name(text, scope, d.stmt.order, depth + 1)
            if d.op == "/=" and d.value is not None:
                return self._divided(found, d.stmt.node, d.value, scope, d.stmt.order, d.stmt)
            return found
        if d.op == "=" and d.tuple_index is not None and isinstance(d.value, cst.Call):
            callee = self.model.local_function(d.value.func, d.stmt.scope)
            if callee is not None:
                return self._returns(callee, depth, d.tuple_index)
        return []

    def _returns(self, callee: Scope, depth: int, index: int | None) -> list[TokenMean]:
        found = []
        for value, stmt in callee.returns:
            value = strip_parens(value)
            if index is not None:
                if not isinstance(value, cst.Tuple) or index >= len(value.elements):
                    continue
                value = value.elements[index].value
            found.extend(self.of(value, callee, stmt.order + 1, stmt, depth + 1))
        return found

    def _call(self, node: cst.Call, scope, order, stmt, depth) -> list[TokenMean]:
        callee = self.model.local_function(node.func, scope)
        if _has_keyword(node, "num_items_in_batch") and callee is None:
            return []  # a model normalised by the window's item count
        qual = self.model.imports.qualify(node.func) or ""
        if qual in _TOKEN_LOSS_FUNCTIONS:
            return self._loss_function(node, qual, stmt)
        loss_class = self._loss_class(node.func, scope, order)
        if loss_class is not None:
            return self._loss_object(node, loss_class, stmt)
        pair = method_call(node)
        if pair is not None and pair[1] in _PASS_METHODS:
            return self.of(pair[0], scope, order, stmt, depth + 1)
        if callee is not None:  # a helper handed `num_items_in_batch=` must use it: read it
            return self._returns(callee, depth, None)
        return []

    def _loss_function(self, node: cst.Call, qual: str, stmt: Stmt) -> list[TokenMean]:
        if _sum_reduction(node):
            return self._token_sum(node, node, stmt)
        if not _mean_reduction(keyword(node, "reduction")):
            return []
        if self._packed_next_tokens(node, keyword(node, "ignore_index"), stmt):
            return []
        ignoring = _has_keyword(node, "ignore_index")
        if ignoring or self._flattened_inputs(node, stmt):
            what = f"`{last_part(qual)}` with the default mean"
            return [TokenMean(node, what, stmt, ignoring)]
        return []

    def _loss_object(self, node: cst.Call, built: cst.Call, stmt: Stmt) -> list[TokenMean]:
        if _sum_reduction(built):
            return self._token_sum(node, built, stmt)
        if not _mean_reduction(keyword(built, "reduction")):
            return []
        if self._packed_next_tokens(node, keyword(built, "ignore_index"), stmt):
            return []
        ignoring = _has_keyword(built, "ignore_index")
        if ignoring or self._flattened_inputs(node, stmt):
            name = last_part(dotted(built.func))
            what = f"`{code(node.func)}` (a `{name}` with the mean)"
            return [TokenMean(node, what, stmt, ignoring)]
        return []

    def _token_sum(self, node: cst.Call, built: cst.Call, stmt: Stmt) -> list[TokenMean]:
        """A token-level loss summed over the micro-batch (`reduction="sum"`)."""
        ignoring = _has_keyword(built, "ignore_index")
        if ignoring or self._flattened_inputs(node, stmt):
            return [TokenMean(node, "a token sum", stmt, ignoring, LossTermKind.SUM, node)]
        return []

    def _packed_next_tokens(self, call: cst.Call, ignore, stmt: Stmt) -> bool:
        """Packed next-token targets: the target is the token stream shifted by one
        (`y = data[:, 1:T + 1]` beside `x = data[:, :T]`, `x, y = batch[:, :-1], batch[:, 1:]`,
        nanoGPT's `get_batch()`), so it holds raw token ids that no negative `ignore_index`
        matches, and with no padding in the module every micro-batch has the same number of
        tokens: the means are equally weighted, no bias. A named `ignore_index` (a pad id) may
        match tokens of the stream, and targets written to (`y[mask] = -1`) are masked."""
        if ignore is not None and not _negative_literal(ignore):
            return False
        if self.model.memo("losses.pads_batches", _pads_batches):
            return False
        args = positional(call)
        target = keyword(call, "target") or (args[1] if len(args) > 1 else None)
        return target is not None and _NextTokens(self.model).of(target, stmt.scope, stmt.order)

    def _flattened_inputs(self, call: cst.Call, stmt: Stmt) -> bool:
        """Logits flattened over batch and time, or targets flattened to one dimension, in
        the call or in the binding of the name it is handed (`shift_logits = ....view(-1, V)`)."""
        args = positional(call)[:2] + [keyword(call, "input"), keyword(call, "target")]
        for arg in (a for a in args if a is not None):
            if _flattening(arg):
                return True
            text = dotted(arg)
            defs = stmt.scope.defs_before(text, stmt.order) if text else []
            if defs and defs[-1].op == "=" and defs[-1].value is not None:
                if _flattening(defs[-1].value):
                    return True
        return False

    def _loss_class(self, func, scope: Scope, order: int) -> cst.Call | None:
        """The `nn.CrossEntropyLoss(...)` call a loss object was built with."""
        text = dotted(func)
        if text is None:
            return None
        defs = scope.defs_before(text, order) or self.model.module_defs(text)
        if not defs or defs[-1].op != "=" or not isinstance(defs[-1].value, cst.Call):
            return None
        built = defs[-1].value
        qual = self.model.imports.qualify(built.func) or ""
        return built if last_part(qual) in _TOKEN_LOSS_CLASSES else None

    def _model_loss(self, node, scope, order, stmt, depth) -> list[TokenMean]:
        """`out.loss` / `out["loss"]` of a call of a token-level model given its labels."""
        holder = node.value
        call = self._model_call(holder, scope, order, depth)
        if call is None or _has_keyword(call, "num_items_in_batch"):
            return []
        if not (_has_keyword(call, "labels") or any(a.star == "**" for a in call.args)):
            return []
        head = self._model_class(call.func, scope, order, 0)
        if head is None:
            return []
        if _sum_reduction(call):  # `model(**batch, loss_reduction="sum")`: a token sum
            return [TokenMean(node, "a token sum", stmt, kind=LossTermKind.SUM, call=call)]
        return [TokenMean(node, f"`.loss` of a model built as `{head}`", stmt)]

    def _model_call(self, holder, scope, order, depth) -> cst.Call | None:
        holder = strip_parens(holder)
        if isinstance(holder, cst.Call):
            return holder
        text = dotted(holder)
        defs = scope.defs_before(text, order) if text else []
        if defs and defs[-1].op == "=" and defs[-1].tuple_index is None and depth < LOSS_DEPTH:
            return self._model_call(defs[-1].value, defs[-1].stmt.scope, defs[-1].stmt.order, depth)
        return None

    def _model_class(self, func, scope: Scope, order: int | None, depth: int) -> str | None:
        """The token-level head class a model object was loaded or built as, following
        `prepare`, wrappers (`DDP(model)`, `torch.compile(model)`) and moves."""
        if depth > _MAX_MODEL_DEPTH:
            return None
        func = strip_parens(func)
        if isinstance(func, cst.Call):
            return self._built_class(func, scope, order, depth)
        text = dotted(func)
        if text is None:
            return None
        prepared = self.model.setup.prepared.get(text)
        defs = scope.defs_before(text, order) if order is not None else scope.defs.get(text, [])
        defs = defs or self.model.module_defs(text)
        if not defs:
            if text in scope.params:
                for expr, stmt in self.model.argument_sites(scope, text):
                    found = self._model_class(expr, stmt.scope, stmt.order, depth + 1)
                    if found is not None:
                        return found
            return None
        d = defs[-1]
        if d.tuple_index is not None:
            if prepared is not None and d in self.model.setup.prepared_defs:
                original = cst.parse_expression(prepared.original)
                return self._model_class(original, d.stmt.scope, d.stmt.order, depth + 1)
            return None
        if d.op != "=" or d.value is None:
            return None
        return self._model_class(d.value, d.stmt.scope, d.stmt.order, depth + 1)

    def _built_class(self, call: cst.Call, scope, order, depth) -> str | None:
        qual = self.model.imports.qualify(call.func) or dotted(call.func) or ""
        pair = method_call(call)
        if pair is not None and pair[1] in _LOADERS:
            qual = self.model.imports.qualify(pair[0]) or dotted(pair[0]) or ""
        elif pair is not None and pair[1] in _WRAPPERS:
            return self._model_class(pair[0], scope, order, depth + 1)
        if _TOKEN_LEVEL_MODEL.search(last_part(qual)):
            return last_part(qual)
        args = positional(call)
        if pair is not None and is_prepare(pair[1]) and len(args) == 1:
            return self._model_class(args[0], scope, order, depth + 1)
        wraps = pair is None or (pair[1] in _LOADERS and dotted(args[0] if args else None))
        if wraps and args:  # `DDP(model)`, `get_peft_model(m)`, `PeftModel.from_pretrained(m)`
            return self._model_class(args[0], scope, order, depth + 1)
        return None


class _NextTokens:
    """Follows a loss target back to raw ids: a slice of a token stream shifted by one from
    another slice of the same stream, or ids drawn from a distribution."""

    _WRAPPERS = {"view", "reshape", "flatten", "contiguous", "long", "to", "cuda", "astype", "int"}
    _TENSOR = {"stack", "from_numpy", "tensor", "as_tensor", "cat", "LongTensor"}
    # Targets sampled from a distribution (Sophia's Hessian estimate: Categorical(logits).sample())
    _DRAWN = {"sample", "multinomial", "argmax"}

    def __init__(self, model: Model) -> None:
        self.model = model

    def of(self, node, scope: Scope, order: int, depth: int = 0) -> bool:
        if depth > _MAX_MODEL_DEPTH:
            return False
        node = strip_parens(node)
        if isinstance(node, (cst.ListComp, cst.GeneratorExp)):
            return self.of(node.elt, scope, order, depth + 1)
        if isinstance(node, cst.Subscript):
            return _shifted_slice(node, scope)
        if isinstance(node, cst.Call):
            pair = method_call(node)
            if pair is not None and pair[1] in self._WRAPPERS:
                return self.of(pair[0], scope, order, depth + 1)
            if (pair is not None and pair[1] in self._DRAWN) or last_part(
                dotted(node.func)
            ) in self._DRAWN - {"sample"}:
                return True  # ids drawn from the model's own distribution: never an ignore index
            args = positional(node)
            if last_part(dotted(node.func)) in self._TENSOR and args:
                return self.of(args[0], scope, order, depth + 1)
            return False
        text = dotted(node)
        defs = scope.defs_before(text, order) if text else []
        if not defs or defs[-1].op != "=" or _written_to(scope, text):
            return False
        d = defs[-1]
        value = strip_parens(d.value) if d.value is not None else None
        if d.tuple_index is None:
            return value is not None and self.of(value, d.stmt.scope, d.stmt.order, depth + 1)
        if isinstance(value, cst.Tuple) and d.tuple_index < len(value.elements):
            element = value.elements[d.tuple_index].value
            return self.of(element, d.stmt.scope, d.stmt.order, depth + 1)
        callee = (
            self.model.local_function(value.func, d.stmt.scope)
            if isinstance(value, cst.Call)
            else None
        )
        if callee is None:
            return False
        found = []
        for returned, stmt in callee.returns:
            returned = strip_parens(returned)
            if isinstance(returned, cst.Tuple) and d.tuple_index < len(returned.elements):
                element = returned.elements[d.tuple_index].value
                found.append(self.of(element, callee, stmt.order + 1, depth + 1))
        return bool(found) and all(found)


def _shifted_slice(node: cst.Subscript, scope: Scope) -> bool:
    """`B[..., a + 1 : ...]` where the same function also slices `B[..., a : ...]`."""
    start = _last_slice_start(node)
    if start is None:
        return False
    base = code(strip_parens(node.value))
    if _written_to(scope, base) or any(
        _MASKS.search(code(d.value)) for d in scope.defs.get(base, []) if d.value is not None
    ):
        return False
    for stmt in scope.stmts:
        for other in walk(stmt.node):
            if other is node or not isinstance(other, cst.Subscript):
                continue
            if code(strip_parens(other.value)) != base:
                continue
            before = _last_slice_start(other)
            if before is not None and before[0] == start[0] and before[1] + 1 == start[1]:
                return True
    return False


def _last_slice_start(node: cst.Subscript) -> tuple[str, int] | None:
    """(symbolic part, offset) of the start of the last slice of a subscript: ("", 1) for
    `x[:, 1:]`, ("i", 1) for `data[i + 1 : j]`, ("", 0) for `x[:, :-1]`."""
    last = node.slice[-1].slice if node.slice else None
    if not isinstance(last, cst.Slice):
        return None
    lower = strip_parens(last.lower) if last.lower is not None else None
    if lower is None:
        return "", 0
    number = _int_literal(lower)
    if number is not None:
        return "", number
    if isinstance(lower, cst.BinaryOperation) and isinstance(lower.operator, cst.Add):
        number = _int_literal(lower.right)
        if number is not None:
            return code(strip_parens(lower.left)), number
    return code(lower), 0


def _int_literal(node) -> int | None:
    node = strip_parens(node)
    return int(node.value, 0) if isinstance(node, cst.Integer) else None


def _negative_literal(node) -> bool:
    node = strip_parens(node)
    return (
        isinstance(node, cst.UnaryOperation)
        and isinstance(node.operator, cst.Minus)
        and isinstance(strip_parens(node.expression), cst.Integer)
    )


def _written_to(scope: Scope, name: str) -> bool:
    """`y[mask] = -1` or `y.masked_fill_(...)` in the function: the targets are masked."""
    for stmt in scope.stmts:
        node = stmt.node
        if isinstance(node, (cst.Assign, cst.AugAssign)):
            targets = (
                [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
            )
            if any(isinstance(t, cst.Subscript) and dotted(t.value) == name for t in targets):
                return True
        for n in walk(node):
            pair = method_call(n) if isinstance(n, cst.Call) else None
            if pair is not None and dotted(pair[0]) == name and pair[1].endswith("_"):
                return True
    return False


def _pads_batches(model: Model) -> bool:
    """Padding anywhere in the module (`padding=`, a padding collator, `pad_sequence`,
    `label_pad_token_id`): batches may differ in length, so even raw targets vary in count."""
    if model.source is not None and not re.search(r"pad|DataCollator", model.source):
        return False
    return _names_any(model, _PADDING_KEYWORDS)


_MASKS = re.compile(r"masked_fill|\bwhere\(|-100")
_PADDING_KEYWORDS = {"padding", "label_pad_token_id", "ignore_pad_token_for_loss", "padding_value"}


def _reads_loss_field(node) -> bool:
    if isinstance(node, cst.Attribute) and node.attr.value == "loss":
        return True
    if isinstance(node, cst.Subscript) and len(node.slice) == 1:
        index = node.slice[0].slice
        return isinstance(index, cst.Index) and string_value(index.value) == "loss"
    return False


def _has_keyword(call: cst.Call, name: str) -> bool:
    return keyword(call, name) is not None


def _mean_reduction(value: cst.BaseExpression | None) -> bool:
    """The default reduction, or `reduction="mean"` written out."""
    return value is None or string_value(value) == "mean"


_SUM_KEYWORDS = {"reduction", "loss_reduction", "reduce"}


def _sum_reduction(call: cst.Call) -> bool:
    """A sum asked of the loss or model call: `reduction="sum"`, `loss_reduction="sum"`,
    `reduce="sum"`, or `"sum"` for another keyword named after a reduction."""
    for arg in call.args:
        name = arg.keyword.value if arg.keyword is not None else None
        if name is not None and (name in _SUM_KEYWORDS or name.endswith("reduction")):
            if string_value(arg.value) == "sum":
                return True
    return False


# Counts of one tensor's valid entries: `(labels != -100).sum()`, `mask.sum().item()`.
_COUNT_METHODS = {"sum", "numel", "count_nonzero"}
_COUNT_WRAPPERS = {"item", "float", "double", "int", "long", "to", "clamp", "clamp_min", "detach"}
# Spellings of a count taken over several micro-batches or ranks: not one micro-batch's own.
_WINDOW_COUNT = re.compile(r"gather|reduce|(?<![.\w])(sum|len)\(|\bfor\b", re.I)


def _own_token_count(model: Model, divisor, scope: Scope, order: int, sums) -> bool:
    """Whether a divisor is the valid-token count of the micro-batch the token sums were
    computed on: a count of a tensor (`(labels != -100).sum()`, `attention_mask.sum()`),
    bound in the same function, not summed over a list of batches or gathered across ranks,
    and reading a name that the loss call reads too (the same micro-batch). The window's
    count (`num_items_in_batch` handed in, `sum(... for b in window)`, `gather(...)`) is not."""
    expr = strip_parens(divisor)
    for _ in range(LOSS_DEPTH):
        text = dotted(expr)
        if text is None:
            break
        defs = scope.defs_before(text, order)
        if len(defs) != 1 or defs[0].op != "=" or defs[0].tuple_index is not None:
            return False  # a parameter, a running total, or several bindings: not this batch's
        if _collected(scope, text):
            return False
        expr, order = strip_parens(defs[0].value), defs[0].stmt.order
    if not _count_call(expr) or _WINDOW_COUNT.search(code(expr)):
        return False
    read = _roots(expr) - {"torch"}
    return any(read & {r for a in t.call.args for r in _roots(a)} for t in sums if t.call)


def _count_call(node) -> bool:
    """`x.sum()`, `x.numel()`, `torch.count_nonzero(x)`, possibly wrapped in `.item()`,
    `.clamp(min=1)` or `max(..., 1)`."""
    node = strip_parens(node)
    if not isinstance(node, cst.Call):
        return False
    if last_part(dotted(node.func)) == "max" and positional(node):
        return _count_call(positional(node)[0])
    pair = method_call(node)
    if pair is not None and pair[1] in _COUNT_WRAPPERS:
        return _count_call(pair[0])
    if pair is not None and pair[1] in _COUNT_METHODS and not node.args:
        return True
    qual = dotted(node.func) or ""
    return qual in ("torch.sum", "torch.count_nonzero") and bool(node.args)


def _collected(scope: Scope, name: str) -> bool:
    """`dist.all_reduce(n_tokens)`: the count is combined across ranks in place."""
    for call in scope.calls:
        if _WINDOW_COUNT.search(last_part(dotted(call.call.func))):
            if any(dotted(a.value) == name for a in call.call.args):
                return True
    return False


def _roots(node) -> set[str]:
    """The names an expression reads (`batch` in `batch["labels"].ne(-100)`), not attributes."""
    attrs = {id(n.attr) for n in walk(node) if isinstance(n, cst.Attribute)}
    return {n.value for n in walk(node) if isinstance(n, cst.Name) and id(n) not in attrs}


def _flattening(node) -> bool:
    """`x.view(-1, V)`, `x.reshape(-1, V)`, `x.view(-1)` or `x.flatten(0, 1)` itself (not a
    flattening somewhere inside, such as an image flattened before a classifier)."""
    pair = method_call(strip_parens(node))
    if pair is None:
        return False
    args = positional(node)
    if pair[1] in ("view", "reshape") and args:
        return code(args[0]).replace(" ", "") == "-1"
    return pair[1] == "flatten" and bool(strip_parens(node).args)


def describe(model: Model, site: Site) -> list[dict]:
    """`--show-loops`: the token-level means that reach this backward."""
    return [{"code": code(t.node), "line": model.line(t.node)} for t in token_means(model, site)]
