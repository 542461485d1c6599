"""Parity of an imported checkpoint against `transformers`: logits and greedy decoding.

A user bringing a Llama / Qwen folder wants to know that `hf.load_pretrained` computes the same
function as the reference implementation before training it. `compare` runs both models in
float32 on the same prompts, alone and left-padded in one batch, and reports per prompt the
largest absolute logit difference over its real tokens; with `float64=True` it also runs the
reference in float64, which measures the float32 rounding floor that any two float32
implementations share; it also compares each prompt run alone with its result inside the
batch, on both sides (float32 sums round differently under kernels chosen for another shape).
`layer_errors` follows one prompt block by block against the reference's float64 hidden states,
which tells rounding from a wrong operation. `greedy_match` checks that our KV-cache decoder
and the reference's full forwards pick the same tokens. `scripts/check_parity.py` is the
command line.

`torch` and `transformers` are imported only by the functions that need them.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rl4agents.models import hf

# The prompts of `default_prompts`: two chats rendered with the model's chat template (when it
# has one) and two plain texts.
CHAT = ({"role": "user", "content": "What is the capital of France?"},)
CHAT_SYSTEM = (
    {"role": "system", "content": "You answer in one short sentence."},
    {"role": "user", "content": "Name a prime number larger than 10."},
    {"role": "assistant", "content": "13 is a prime number."},
    {"role": "user", "content": "And one larger than 100?"},
)
TEXTS = (
    "The quick brown fox jumps over the lazy dog. In 2024, it jumped 1,234 times.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
)
PROMPT_NAMES = ("chat", "chat_system", "prose", "code")


def default_prompts(tok) -> list[list[int]]:
    """Token ids of the four parity prompts (`PROMPT_NAMES`) under tokenizer `tok` (an
    `hf_tokenizer.HFTokenizer`). Without a chat template the chats are joined as plain text."""
    texts = []
    for messages in (CHAT, CHAT_SYSTEM):
        if tok.chat_template:
            texts.append(tok.apply_chat_template(list(messages), add_generation_prompt=True))
        else:
            texts.append("\n".join(m["content"] for m in messages))
    return [tok.encode(text) for text in texts + list(TEXTS)]


def random_prompts(vocab_size: int, lengths: Sequence[int], seed: int = 0) -> list[list[int]]:
    """Prompts of random token ids in [0, vocab_size), one per length: for folders without a
    tokenizer."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab_size, n).tolist() for n in lengths]


def batch(seqs: Sequence[Sequence[int]], pad_id: int, left: bool):
    """(int32[B, S] tokens, int32[B, S] positions, bool[B, S, S] attention mask, bool[B, S]
    valid) of the prompts `seqs`, S the longest.

    Left padding: real tokens at the end, positions from 0 at the first real one, pads masked
    out as keys (a pad attends to itself only). Otherwise each row starts at position 0 and is
    filled on the right under a plain causal mask: the fill comes after every real token, so
    no real token's logits can see it and each row computes as if alone.
    """
    width = max(len(s) for s in seqs)
    tokens = np.full((len(seqs), width), pad_id, np.int32)
    valid = np.zeros((len(seqs), width), bool)
    for row, seq in enumerate(seqs):
        at = slice(width - len(seq), width) if left else slice(0, len(seq))
        tokens[row, at], valid[row, at] = seq, True
    causal = np.tril(np.ones((width, width), bool))[None]
    if not left:
        positions = np.broadcast_to(np.arange(width, dtype=np.int32), tokens.shape)
        return tokens, positions, np.broadcast_to(causal, (len(seqs), width, width)), valid
    positions = np.maximum(np.cumsum(valid, axis=1) - 1, 0).astype(np.int32)
    mask = (causal & valid[:, None, :]) | np.eye(width, dtype=bool)[None]
    return tokens, positions, mask, valid


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, state, tokens, positions, mask):
    return nnx.merge(graphdef, state)(tokens, positions, mask).logits


def our_logits(policy, tokens, positions, mask) -> np.ndarray:
    """f32[B, S, V] logits of our policy (an `hf.load_pretrained` model) on `batch`'s arrays."""
    graphdef, state = nnx.split(policy)
    return np.asarray(_forward(graphdef, state, *map(jnp.asarray, (tokens, positions, mask))))


def reference_logits(ref, tokens, positions, valid, left: bool) -> np.ndarray:
    """[B, S, V] logits of a transformers causal LM (in its own dtype) on `batch`'s arrays:
    with left padding its attention mask and our positions, otherwise plain causal."""
    import torch

    kwargs = {}
    if left:
        kwargs = dict(
            attention_mask=torch.tensor(valid, dtype=torch.long),
            position_ids=torch.tensor(positions, dtype=torch.long),
        )
    with torch.no_grad():
        return ref(torch.tensor(tokens, dtype=torch.long), **kwargs).logits.numpy()


def reference_greedy(ref, ids: Sequence[int], num_new: int) -> list[int]:
    """Greedy continuation by the reference's full forwards, one token at a time (no cache, no
    stop token)."""
    import torch

    seq = torch.tensor([list(ids)], dtype=torch.long)
    with torch.no_grad():
        for _ in range(num_new):
            nxt = ref(seq).logits[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], dim=1)
    return seq[0, len(ids) :].tolist()


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def compare(policy, ref, seqs: Sequence[Sequence[int]], pad_id: int, float64: bool = False):
    """Per prompt, max |ours - reference| over the logits of its real tokens. Returns a dict of
    lists of float (one entry per prompt):

      unpadded                 ours vs the reference, each prompt as if alone
      left_padded              the same, all prompts in one left-padded batch
      ours_padded_vs_unpadded  ours left-padded vs ours right-filled (0 when padding is exact)
      log_probs                max |log-softmax difference|, unpadded
      alone                    ours vs the reference, each prompt in a batch of its own
      ours_batch_vs_alone      ours in the batch of all prompts vs ours alone
      reference_batch_vs_alone the reference in the batch vs the reference alone
      ours_vs_reference_f64    (float64) ours vs the reference run in float64
      reference_f32_vs_f64     (float64) the reference's float32 vs its float64: the floor

    `ref` is a float32 transformers model; with `float64` it is cast to float64 for one
    forward and back to float32.
    """
    logits = {}
    for left in (False, True):
        tokens, positions, mask, valid = batch(seqs, pad_id, left)
        logits[left] = (
            our_logits(policy, tokens, positions, mask),
            reference_logits(ref, tokens, positions, valid, left),
        )
        if float64 and not left:
            ref.double()
            logits["f64"] = reference_logits(ref, tokens, positions, valid, left)
            ref.float()
    rows = {False: [], True: []}
    for row, seq in enumerate(seqs):
        rows[False].append((row, slice(0, len(seq))))
        rows[True].append((row, slice(-len(seq), None)))

    def diffs(a, b, a_left, b_left, fn=lambda x: x):
        return [
            float(np.abs(fn(a[r, ra]) - fn(b[r, rb])).max())
            for (r, ra), (_, rb) in zip(rows[a_left], rows[b_left], strict=True)
        ]

    alone = []
    for seq in seqs:
        one = batch([seq], pad_id, left=False)
        alone.append(
            (
                our_logits(policy, *one[:3])[0],
                reference_logits(ref, one[0], one[1], one[3], False)[0],
            )
        )
    ours, theirs = logits[False]
    n = [len(s) for s in seqs]
    out = {
        "unpadded": diffs(ours, theirs, False, False),
        "left_padded": diffs(*logits[True], True, True),
        "ours_padded_vs_unpadded": diffs(logits[True][0], ours, True, False),
        "log_probs": diffs(ours, theirs, False, False, _log_softmax),
        "alone": [float(np.abs(a - b).max()) for a, b in alone],
        "ours_batch_vs_alone": [
            float(np.abs(ours[r, : n[r]] - a).max()) for r, (a, _) in enumerate(alone)
        ],
        "reference_batch_vs_alone": [
            float(np.abs(theirs[r, : n[r]] - b).max()) for r, (_, b) in enumerate(alone)
        ],
    }
    if float64:
        out["ours_vs_reference_f64"] = diffs(ours, logits["f64"], False, False)
        out["reference_f32_vs_f64"] = diffs(theirs, logits["f64"], False, False)
    return out


@functools.partial(jax.jit, static_argnums=0)
def _hidden_states(graphdef, state, tokens, positions, mask):
    decoder = nnx.merge(graphdef, state).model
    x = decoder._embed(tokens)
    states = [x]
    for layer in decoder.layers:
        x, _ = layer(x, positions, mask, None, 0)
        states.append(x)
    states[-1] = decoder.final_norm(x)
    return states


def layer_errors(policy, ref, ids: Sequence[int]) -> list[dict]:
    """Where along the depth ours and the reference's float32 part from the reference's float64,
    on one prompt `ids`: per hidden state (0: the embeddings, i: after block i, the last one
    after the final norm, as transformers' `output_hidden_states`) a dict with `max_abs` (the
    reference's largest |value|, f64), `ours` and `reference_f32` (largest |difference| from
    the f64 states), and `ours_position` (the token position of ours' largest difference).

    Tells a rounding difference (both float32 errors of one size, growing where activations
    are large) from a wrong operation (ours jumps at one block)."""
    import torch

    tokens, positions, mask, _ = batch([ids], 0, left=False)
    graphdef, state = nnx.split(policy)
    ours = _hidden_states(graphdef, state, *map(jnp.asarray, (tokens, positions, mask)))
    with torch.no_grad():
        run = lambda: ref(torch.tensor(tokens, dtype=torch.long), output_hidden_states=True)  # noqa: E731
        f32 = [h[0].numpy() for h in run().hidden_states]
        ref.double()
        f64 = [h[0].numpy() for h in run().hidden_states]
        ref.float()
    rows = []
    for o, a, b in zip(ours, f32, f64, strict=True):
        err = np.abs(np.asarray(o)[0] - b)
        rows.append(
            dict(
                max_abs=float(np.abs(b).max()),
                ours=float(err.max()),
                reference_f32=float(np.abs(a - b).max()),
                ours_position=int(np.unravel_index(err.argmax(), err.shape)[0]),
            )
        )
    return rows


def greedy_match(policy, ref, ids: Sequence[int], num_new: int) -> dict:
    """Our KV-cache greedy decoder (`hf.greedy_generate`) against the reference's full forwards
    on one prompt: {"ours": [...], "reference": [...], "equal": bool, "first_mismatch": int or
    None}."""
    ours = np.asarray(hf.greedy_generate(policy, np.asarray([list(ids)], np.int32), num_new))
    ours = ours[0].tolist()
    theirs = reference_greedy(ref, ids, num_new)
    mismatch = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
    return dict(ours=ours, reference=theirs, equal=ours == theirs, first_mismatch=mismatch)
