"""Text metrics with promptfoo's exact definitions: Levenshtein, ROUGE-N, BLEU."""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter

from .jsvalues import JS_SPACE_CLASS, is_js_space, js_trim, utf16_units


def levenshtein(a: str, b: str) -> int:
    """Edit distance counted in UTF-16 code units, as JavaScript measures strings.

    Hyyrö's bit-parallel algorithm (Python ints as bit vectors): O(len(a) * len(b) / 64).
    """
    text, pattern = utf16_units(a), utf16_units(b)
    if len(pattern) > len(text):
        text, pattern = pattern, text
    m = len(pattern)
    if m == 0:
        return len(text)
    peq: dict[int, int] = {}
    for i, unit in enumerate(pattern):
        peq[unit] = peq.get(unit, 0) | (1 << i)
    full = (1 << m) - 1
    high = 1 << (m - 1)
    pv, mv, score = full, 0, m
    for unit in text:
        eq = peq.get(unit, 0)
        xv = eq | mv
        xh = ((((eq & pv) + pv) & full) ^ pv) | eq
        ph = (mv | ~(xh | pv)) & full
        mh = pv & xh
        if ph & high:
            score += 1
        elif mh & high:
            score -= 1
        ph = ((ph << 1) | 1) & full
        mh = (mh << 1) & full
        pv = (mh | ~(xv | ph)) & full
        mv = ph & xv
    return score


# -- BLEU (promptfoo src/assertions/bleu.ts) ------------------------------------------------------

def _bleu_tokens(text: str) -> list[str]:
    """``text.toLowerCase().trim().split(/\\s+/)``."""
    return re.split(JS_SPACE_CLASS + "+", js_trim(text.lower()))


def _ngrams(words: list[str], n: int) -> list[str]:
    if n <= 0 or n > len(words):
        return []
    return [" ".join(words[i : i + n]) for i in range(len(words) - n + 1)]


def bleu(candidate: str, references: list[str], weights: tuple[float, ...] = (0.25, 0.25, 0.25, 0.25)) -> float:
    """Up-to-4-gram BLEU with brevity penalty, smoothing zero precisions to 1e-7."""
    if not references:
        raise ValueError("Invalid inputs")
    if js_trim(candidate) == "":
        return 0.0
    words = _bleu_tokens(candidate)
    reference_words = [_bleu_tokens(r) for r in references]
    closest = reference_words[0].__len__()
    for ref in reference_words[1:]:
        current, previous = abs(len(ref) - len(words)), abs(closest - len(words))
        if current < previous or (current == previous and len(ref) < closest):
            closest = len(ref)
    usable = []
    for n in range(1, 5):
        grams = _ngrams(words, n)
        if not grams:
            continue
        counts = Counter(grams)
        best = 0
        for ref in reference_words:
            ref_counts = Counter(_ngrams(ref, n))
            best = max(best, sum(min(c, ref_counts.get(g, 0)) for g, c in counts.items()))
        usable.append((best / len(grams), weights[n - 1]))
    penalty = 1.0 if len(words) > closest else math.exp(1 - closest / len(words))
    weight_sum = sum(w for _, w in usable)
    if weight_sum == 0:
        return 0.0
    total = 0.0
    for precision, weight in usable:
        total += weight / weight_sum * math.log(1e-7 if precision == 0 else precision)
    return penalty * math.exp(total)


# -- ROUGE-N (promptfoo src/assertions/rouge.ts over js-rouge 3.x) --------------------------------

_CONTRACTIONS = [
    re.compile(rf"(?<![\w\u200c\u200d]){p}(?![\w\u200c\u200d])", re.IGNORECASE)
    for p in (
        "(can)(not)", "(d)('ye)", "(gim)(me)", "(gon)(na)", "(got)(ta)",
        "(lem)(me)", "(more)('n)", "(wan)(na)(?= )", "('t)(is)", "('t)(was)",
    )
]


def _category_in(ch: str, prefixes: tuple[str, ...]) -> bool:
    return ch != "" and unicodedata.category(ch).startswith(prefixes)


def _opens_after(text: str, i: int) -> bool:
    """js-rouge's ``Ze``: position ``i`` can open a quotation (start, after whitespace,
    punctuation, ``<`` or an opening ````````)."""
    if i == 0:
        return True
    before = text[i - 1]
    return is_js_space(before) or before == "<" or _category_in(before, ("P",)) or text[max(0, i - 2):i] == "``"


_QUOTE_TOKEN = re.compile(r"``|''|\"")


def _next_quote(text: str, start: int) -> str | None:
    match = _QUOTE_TOKEN.search(text, start)
    return match.group(0) if match else None


def treebank_tokenize(text: str) -> list[str]:
    """js-rouge 3.2's ``treeBankTokenize`` (the Penn Treebank tokenizer promptfoo's rouge-n uses).

    Quotes follow js-rouge's rules: a ``"`` (or ``''`` before a word that a later ``''`` closes)
    opens a quotation, tokenized as ````````, when it is at the start, or after whitespace, an
    opening bracket or ``<``, may open there (after whitespace or punctuation), does not follow
    ``.``, ``!`` or ``?``, and the previous quote did not open one; otherwise it closes (``''``).
    One js-rouge refinement is left out: a quote after a modifier letter (``\\p{Lm}``) that
    follows a number after sentence-final punctuation. Positions count code points, not UTF-16
    units, which differs only next to characters outside the BMP.
    """
    text = js_trim(re.sub(JS_SPACE_CLASS[:-1] + "\u0085]+", " ", text))
    if not text:
        return []
    previous_opened = False

    def quote(match: re.Match[str]) -> str:
        nonlocal previous_opened
        token, i = match.group(0), match.start()
        before = text[i - 1] if i > 0 else ""
        opened = token == "``" or (
            (i + len(token) < len(text) or i == 0 or is_js_space(before) or before == "<"
             or _category_in(before, ("Ps",)))
            and not previous_opened
            and _opens_after(text, i)
            and before not in (".", "!", "?")
            and (token == '"' or (
                i > 0
                and _category_in(text[i + 2:i + 3], ("L", "N", "Sc", "Ps"))
                and _next_quote(text, i + 2) == "''"
            ))
        )
        previous_opened = opened
        return " `` " if opened else " '' "

    s = _QUOTE_TOKEN.sub(quote, text)
    s = s.replace("...", " ... ")
    s = re.sub(r"[:,](?!\d)", lambda m: f" {m.group(0)} ", s)
    s = re.sub(r"[;@#$%&]", lambda m: f" {m.group(0)} ", s)
    s = re.sub(r"([^.])(?<!\b[A-Za-z]\.[A-Za-z])(\.)([\])}>'" + JS_SPACE_CLASS[1:-1] + r"]*)\Z", r"\1 \2\3 ", s,
               flags=re.ASCII)
    s = re.sub(r"[?!]", lambda m: f" {m.group(0)} ", s)
    s = re.sub(r"[\][(){}<>]", lambda m: f" {m.group(0)} ", s)
    s = s.replace("--", " -- ")
    s = f" {s} "
    s = re.sub(r"([^'])' ", r"\1 ' ", s)
    s = re.sub(r"'([sSmMdD]) ", r" '\1 ", s)
    s = re.sub(r"('ll|'LL|'re|'RE|'ve|'VE|n't|N'T) ", r" \1 ", s)
    for pattern in _CONTRACTIONS:
        s = pattern.sub(lambda m: " " + " ".join(g for g in m.groups()) + " ", s)
    s = re.sub(r" {2,}", " ", s)
    s = re.sub(r"^ | $", "", s)
    return s.split(" ")


def _f_measure(p: float, r: float, beta: float = 1.0) -> float:
    """js-rouge's ``fMeasure``, formula for formula (so results agree to the last bit)."""
    if p == r:
        return p
    if p == 0 or r == 0:
        return 0.0
    if p > r:
        inverse_sq = (1 / beta) ** 2
        return min(p, r * ((1 + inverse_sq) / (1 + inverse_sq * (r / p))))
    beta_sq = beta * beta
    return min(r, p * ((1 + beta_sq) / (1 + beta_sq * (p / r))))


def rouge_n(candidate: str, reference: str, n: int = 1) -> float:
    """ROUGE-N F-measure with clipped n-gram counts (callers lower-case both sides)."""
    candidate_tokens = treebank_tokenize(candidate)
    reference_tokens = treebank_tokenize(reference)
    if len(candidate_tokens) < n or len(reference_tokens) < n:
        return 0.0
    candidate_grams = _ngrams(candidate_tokens, n)
    reference_grams = _ngrams(reference_tokens, n)
    reference_counts = Counter(reference_grams)
    overlap = sum(min(c, reference_counts.get(g, 0)) for g, c in Counter(candidate_grams).items())
    if overlap == 0:
        return 0.0
    return _f_measure(overlap / len(candidate_grams), overlap / len(reference_grams))
