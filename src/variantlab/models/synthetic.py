"""Random-weight checkpoints of the model shapes people deploy, with a tokenizer of their vocabulary size.

A shape is its layers and its vocabulary: at 32k–152k tokens the embedding and the output head weigh as
much as many layers, so a benchmark on the shipped 1,024-token tokenizer measures a different model. This
module owns the registry of real shapes (`SHAPES`: Qwen2.5-0.5B, Llama-3.2-1B, SmolLM2-360M, a Llama-2-style
32k model, and 2-layer "-vocab-tiny" shapes of the same vocabularies for tests), `synthetic_tokenizer`
(a byte-level BPE of exactly `vocab_size` tokens, made without a corpus) and `write_checkpoint`, which
writes a local Hugging Face folder that `AutoModelForCausalLM` / `AutoTokenizer.from_pretrained(...,
local_files_only=True)` load. `python -m variantlab.models.synthetic OUT --shape qwen2.5-0.5b` writes one.

The tokenizer's pipeline is Qwen2's (NFC, Qwen2's split pattern, ByteLevel without its own regex, a
ByteLevel decoder; Llama-3's differs only in grouping digits by three). Its merges are synthesized, in
rank order: whitespace and punctuation runs, 'Ġ' + each letter, common English letter pairs, trigrams
and affixes, then about 1,300 common words (with 'Ġ', capitalized, and with -s/-ed/-ing). Each target is
first encoded with the merges so far and its pieces are then merged left to right, so it becomes one token
whatever came before; merges of later rank cannot undo it. The rest, up to `vocab_size`, joins word and
word-start tokens to word-piece tokens in order of the sum of their ranks: merges of higher rank only ever
join pieces, so they never lengthen an encoding. Every merge joins two tokens into a new one, hence
vocab = 256 bytes + merges + 3 special tokens (`<|endoftext|>`, BOS/EOS/PAD as in Qwen2, `<|im_start|>`,
`<|im_end|>`). BpeTrainer on a generated corpus also reached 151,936 tokens, deterministically, but took
many times as long, and it reaches the size only where the corpus holds enough distinct pairs (docs/results.md).

Which tokenizer class loads (transformers 5.23): in a folder whose config.json says `qwen2`, AutoTokenizer
gives `Qwen2Tokenizer` whatever tokenizer_config.json names (qwen2 is on transformers' list of model types
whose hub class is not trusted), and Qwen2Tokenizer rebuilds Qwen2's pipeline around tokenizer.json's vocab
and merges; a folder without config.json, or a llama one, gives the class tokenizer_config.json names,
`TokenizersBackend` for the default (and for 'LlamaTokenizer', with a warning, the file being ByteLevel).
Because this tokenizer's pipeline is Qwen2's, every case gives the same ids: "Done.\n\nThe end" is
[68, 647, 262, 784, 1656] ('D', 'one', '.ĊĊ', 'The', 'Ġend') at 151,936 tokens, from Qwen2Tokenizer and from
TokenizersBackend (tests/models/test_synthetic.py checks it). With GPT-2's pattern in tokenizer.json they
differ: TokenizersBackend splits the newlines ('.', 'Ċ', 'Ċ': 7 ids), the Qwen2 folder's class does not.
"""
from __future__ import annotations

import json
import math
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import VariantlabError

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
END_OF_TEXT = SPECIAL_TOKENS[0]
# Qwen2's pre-tokenizer pattern (transformers' Qwen2Tokenizer): contractions, words with one leading
# non-letter, single digits, punctuation runs, newlines, spaces.
SPLIT_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                 r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}     # torch's name → the safetensors code
INIT_STD = 0.02                     # transformers' initializer_range: logits of a few tenths, finite, not flat


@dataclass(frozen=True)
class Shape:
    """A decoder-only model's shape: what its weights and a token's work are made of."""

    name: str
    arch: str                       # 'llama' | 'qwen2' (Qwen2: bias on q, k and v)
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool                      # the output head is the embedding
    head_dim: int | None = None     # None: hidden // heads
    max_position: int = 4096
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden // self.heads

    def params(self) -> int:
        """Parameters, counted from the shape (a tied head counts once), as transformers' model holds them."""
        q, kv = self.heads * self.head_size, self.kv_heads * self.head_size
        attention = self.hidden * (q + 2 * kv) + q * self.hidden + ((q + 2 * kv) if self.arch == "qwen2" else 0)
        layer = attention + 3 * self.hidden * self.intermediate + 2 * self.hidden
        head = 0 if self.tied else self.vocab * self.hidden
        return self.vocab * self.hidden + self.layers * layer + self.hidden + head

    def config(self, dtype: str = "float32"):
        """The transformers config of this shape, <|endoftext|> as BOS, EOS and PAD."""
        from transformers import LlamaConfig, Qwen2Config
        special = self.vocab - len(SPECIAL_TOKENS)          # the special tokens are the last ids
        common = dict(vocab_size=self.vocab, hidden_size=self.hidden, intermediate_size=self.intermediate,
                      num_hidden_layers=self.layers, num_attention_heads=self.heads,
                      num_key_value_heads=self.kv_heads, max_position_embeddings=self.max_position,
                      rms_norm_eps=self.norm_eps, tie_word_embeddings=self.tied, dtype=dtype,
                      rope_parameters={"rope_theta": self.rope_theta, "rope_type": "default"},
                      bos_token_id=special, eos_token_id=special, pad_token_id=special,
                      initializer_range=INIT_STD)
        if self.arch == "qwen2":
            if self.head_size * self.heads != self.hidden:
                raise VariantlabError(f"shape '{self.name}': Qwen2's heads are hidden // heads wide",
                                      field="head_dim", accepted=f"None or {self.hidden // self.heads}")
            return Qwen2Config(**common, architectures=["Qwen2ForCausalLM"])
        if self.arch == "llama":
            return LlamaConfig(**common, head_dim=self.head_size, architectures=["LlamaForCausalLM"])
        raise VariantlabError(f"unknown architecture '{self.arch}' in shape '{self.name}'", field="arch",
                              accepted="'llama' | 'qwen2'")


def _shapes(*shapes: Shape) -> dict[str, Shape]:
    return {s.name: s for s in shapes}


# The first three as the models' config.json files give them (Llama-3.2's llama3 rope scaling left out: it
# changes the rotation angles, not the work of a token); llama-2-style-32k is a small Llama with Llama-2's
# vocabulary and, as Llama-2, an output head of its own.
SHAPES = _shapes(
    Shape("qwen2.5-0.5b", "qwen2", 896, 4864, 24, 14, 2, 151_936, True, max_position=32768, rope_theta=1e6,
          norm_eps=1e-6),
    Shape("llama-3.2-1b", "llama", 2048, 8192, 16, 32, 8, 128_256, True, head_dim=64, max_position=131072,
          rope_theta=5e5),
    Shape("smollm2-360m", "llama", 960, 2560, 32, 15, 5, 49_152, True, max_position=8192, rope_theta=1e5),
    Shape("llama-2-style-32k", "llama", 1024, 2816, 12, 16, 16, 32_000, False),
    # the same vocabularies on 2 narrow layers: what the tests load
    Shape("qwen2-vocab-tiny", "qwen2", 64, 128, 2, 4, 2, 151_936, True, rope_theta=1e6, norm_eps=1e-6),
    Shape("llama3-vocab-tiny", "llama", 64, 128, 2, 4, 2, 128_256, True, rope_theta=5e5),
    Shape("smollm2-vocab-tiny", "llama", 64, 128, 2, 4, 2, 49_152, True, rope_theta=1e5),
    Shape("llama2-vocab-tiny", "llama", 64, 128, 2, 4, 4, 32_000, False),
)


def get_shape(name: str) -> Shape:
    """SHAPES[name], or a VariantlabError that lists the names."""
    if name not in SHAPES:
        raise VariantlabError(f"unknown shape '{name}'", field="shape", accepted=" | ".join(SHAPES))
    return SHAPES[name]


# ---------------------------------------------------------------------------- the tokenizer

def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte → printable character map (ByteLevel's alphabet): printable bytes stand for
    themselves, the others move to U+0100 on, so a space is 'Ġ' and a newline 'Ċ'."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    moved = [b for b in range(256) if b not in kept]
    return {**{b: chr(b) for b in kept}, **{b: chr(256 + i) for i, b in enumerate(moved)}}


def _bpe(word: str, ranks: dict[tuple[str, str], int]) -> list[str]:
    """Encode one pre-token as tokenizers' BPE does: join the adjacent pair of lowest rank, leftmost first."""
    parts = list(word)
    while len(parts) > 1:
        best = min(((ranks[p], i) for i, p in enumerate(zip(parts, parts[1:])) if p in ranks), default=None)
        if best is None:
            break
        i = best[1]
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return parts


def _english_targets() -> list[str]:
    """The strings made single tokens first, in rank order ('Ġ' is the space before a word)."""
    words = list(dict.fromkeys(_WORDS.split()))
    targets = _PUNCTUATION.split() + ["Ġ" + c for c in _LETTERS + _LETTERS.upper()]
    targets += _BIGRAMS.split() + _TRIGRAMS.split() + _AFFIXES.split()
    alphabet = byte_alphabet()                  # typographic punctuation and accented letters: one token each
    for ch in _NON_ASCII + "".join(map(chr, range(0xC0, 0x100))):
        as_bytes = "".join(alphabet[b] for b in ch.encode())
        targets += [as_bytes, "Ġ" + as_bytes] if ch in _NON_ASCII else [as_bytes]
    for i, w in enumerate(words):
        targets += ["Ġ" + w] + (["Ġ" + w.capitalize(), w.capitalize()] if i < 150 else [])
    targets += ["Ġ" + w + s for w in words for s in ("s", "ed", "ing")]
    return targets


def synthetic_merges(vocab_size: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """(vocab without the special tokens, merges in rank order), len(vocab) == vocab_size - 3."""
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise VariantlabError(f"vocab_size {vocab_size} is too small for a byte-level tokenizer",
                              field="vocab_size", accepted=f"at least {256 + len(SPECIAL_TOKENS)}")
    vocab = {c: b for b, c in byte_alphabet().items()}
    n_merges = vocab_size - 256 - len(SPECIAL_TOKENS)
    merges: list[tuple[str, str]] = []
    ranks: dict[tuple[str, str], int] = {}

    def add(a: str, b: str) -> bool:
        if a + b in vocab or len(merges) >= n_merges:
            return False
        vocab[a + b] = len(vocab)
        ranks[(a, b)] = len(merges)
        merges.append((a, b))
        return True

    for target in _english_targets():           # each becomes one token: encode it, then join its pieces
        parts = _bpe(target, ranks)
        while len(parts) > 1 and add(parts[0], parts[1]):
            parts[:2] = [parts[0] + parts[1]]
    # the rest: a word or word start + a word piece, by the sum of their ranks (a diagonal walk)
    left = [t for t in list(vocab)[256:] if t.lstrip("Ġ").isalpha()]
    right = list(_LETTERS) + [t for t in left if t[0] != "Ġ" and t.islower()]
    d = 0
    while len(merges) < n_merges:
        if d > len(left) + len(right):
            raise VariantlabError(f"cannot synthesize {vocab_size:,} tokens", field="vocab_size",
                                  accepted=f"at most {len(vocab) + len(SPECIAL_TOKENS):,}")
        for i in range(max(0, d - len(right) + 1), min(d, len(left) - 1) + 1):
            add(left[i], right[d - i])
        d += 1
    return vocab, merges


def synthetic_tokenizer(vocab_size: int):
    """A byte-level BPE `tokenizers.Tokenizer` of exactly `vocab_size` tokens, the same for the same size.

    Args:
        vocab_size: tokens in all, the 3 special tokens (the last ids) included; at least 259.
    Returns:
        The tokenizer: Qwen2's pre-tokenization, lossless on NFC text, 3–5 characters a token on English
        prose at 32k–152k tokens (docs/results.md).
    Raises:
        VariantlabError: vocab_size is below 259.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    vocab, merges = synthetic_merges(vocab_size)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return tok


# ---------------------------------------------------------------------------- the checkpoint

def _tensor_specs(shape: Shape, dtype: str) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every tensor the checkpoint stores, from transformers' model built on the meta device
    (no memory): a tied head is stored once, as the embedding, as save_pretrained stores it."""
    import torch
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(shape.config(dtype))
    return [(name, tuple(p.shape)) for name, p in model.named_parameters()]


def _random_tensor(name: str, size: tuple[int, ...], generator, dtype):
    """transformers' initialisation: weights ~ N(0, 0.02), biases 0, norm scales 1."""
    import torch
    if name.endswith(".bias"):
        return torch.zeros(size, dtype=dtype)
    if len(size) == 1:
        return torch.ones(size, dtype=dtype)
    return torch.randn(size, generator=generator).mul_(INIT_STD).to(dtype)     # in place: one copy at float32


def _write_safetensors(path: Path, specs: list[tuple[str, tuple[int, ...]]], dtype: str, seed: int) -> int:
    """Write the header from the shapes, then each tensor as it is drawn: one tensor in memory at a time
    (safetensors' save_file holds the whole state dict and a bytes copy of each tensor). Returns bytes written."""
    import torch
    size = getattr(torch, dtype).itemsize
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, dims in specs:
        n = math.prod(dims) * size
        header[name] = {"dtype": DTYPES[dtype], "shape": list(dims), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)                    # the data starts 8-byte aligned
    generator = torch.Generator().manual_seed(seed)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for name, dims in specs:
            t = _random_tensor(name, dims, generator, getattr(torch, dtype))
            f.write(t.contiguous().view(torch.uint8).numpy().data)
    return 8 + len(raw) + offset


def write_checkpoint(path: str | Path, shape: Shape | str, *, seed: int = 0, dtype: str = "float32",
                     tokenizer_class: str | None = None) -> dict:
    """Write a random-weight checkpoint of `shape` with a synthetic tokenizer of its vocabulary.

    Writes config.json, generation_config.json, model.safetensors, the tokenizer files save_pretrained writes
    (tokenizer.json, tokenizer_config.json) and special_tokens_map.json. The weights are the same for the same
    seed and dtype; the model's memory is one tensor at a time, whatever the shape.

    Args:
        path: the folder (made if missing; files of the same names are replaced).
        shape: a Shape, or a name in SHAPES.
        seed: seeds the weights.
        dtype: 'float32' | 'bfloat16' | 'float16', of the weights and config.json's dtype.
        tokenizer_class: the class tokenizer_config.json names, e.g. 'Qwen2Tokenizer' as Qwen checkpoints ship;
            None: 'TokenizersBackend' (what transformers 5 calls PreTrainedTokenizerFast). In a qwen2 folder
            AutoTokenizer loads Qwen2Tokenizer either way, with the same ids (module docstring).
    Returns:
        What was written: shape, params, bytes (all files), vocab, seconds.
    Raises:
        VariantlabError: an unknown shape name or dtype.
    """
    from transformers import GenerationConfig, TokenizersBackend
    t0 = time.perf_counter()
    shape = get_shape(shape) if isinstance(shape, str) else shape
    if dtype not in DTYPES:
        raise VariantlabError(f"unknown dtype '{dtype}'", field="dtype", accepted=" | ".join(DTYPES))
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = shape.config(dtype)
    config.save_pretrained(path)
    GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                     pad_token_id=config.pad_token_id, do_sample=False).save_pretrained(path)
    _write_safetensors(path / "model.safetensors", _tensor_specs(shape, dtype), dtype, seed)
    TokenizersBackend(tokenizer_object=synthetic_tokenizer(shape.vocab), bos_token=END_OF_TEXT,
                      eos_token=END_OF_TEXT, pad_token=END_OF_TEXT, unk_token=None,
                      model_max_length=shape.max_position).save_pretrained(path)
    if tokenizer_class is not None:
        settings = json.loads((path / "tokenizer_config.json").read_text())
        settings["tokenizer_class"] = tokenizer_class
        (path / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n")
    # transformers 5 no longer writes it; readers written for transformers 4 still look for it
    special = {"bos_token": END_OF_TEXT, "eos_token": END_OF_TEXT, "pad_token": END_OF_TEXT}
    (path / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
    return {"shape": shape.name, "params": shape.params(), "vocab": shape.vocab, "dtype": dtype,
            "bytes": sum(f.stat().st_size for f in path.iterdir() if f.is_file()),
            "seconds": round(time.perf_counter() - t0, 2)}


def main(argv: list[str] | None = None) -> int:
    """python -m variantlab.models.synthetic OUT_DIR --shape NAME [--seed N] [--dtype D] [--tokenizer-class C]"""
    import argparse
    parser = argparse.ArgumentParser(prog="python -m variantlab.models.synthetic", description=main.__doc__)
    parser.add_argument("out", type=Path, help="folder to write")
    parser.add_argument("--shape", required=True, help=" | ".join(SHAPES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="float32", help=" | ".join(DTYPES))
    parser.add_argument("--tokenizer-class", default=None, help="e.g. Qwen2Tokenizer (default TokenizersBackend)")
    args = parser.parse_args(argv)
    try:
        done = write_checkpoint(args.out, args.shape, seed=args.seed, dtype=args.dtype,
                                tokenizer_class=args.tokenizer_class)
    except VariantlabError as e:
        print(f"error: {e.one_line()}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {args.out}: cannot write it: {e.strerror}", file=sys.stderr)
        return 2
    print(describe(args.out, done))
    return 0


def describe(path: Path, done: dict) -> str:
    """One line for what write_checkpoint wrote."""
    return (f"wrote {path}: {done['shape']}, {done['params']:,} parameters ({done['dtype']}), vocab "
            f"{done['vocab']:,}, {done['bytes']:,} bytes in {done['seconds']:.1f} s")


# ---------------------------------------------------------------------------- what the merges are made of

_LETTERS = "tasoicwbpfmhdrelnguvyjkqxz"          # by how often English words start with them
_PUNCTUATION = """ĠĠ ĠĠĠ ĠĠĠĠ ĠĠĠĠĠĠĠĠ ĊĊ .Ċ .ĊĊ ,Ċ :Ċ Ġ( Ġ" Ġ- Ġ-- ... Ġ= Ġ{ Ġ[ (). ), ). ." ," ): ); 's 't 're
've 'm 'll 'd"""
_NON_ASCII = "’“”—–…‘•€£°©®™×"
_BIGRAMS = """th he in er an re on at en nd ti es or te of ed is it al ar st to nt ng se ha as ou io le ve co me de hi
ri ro ic ne ea ra ce li ch ll be ma si om ur ca el ta la ns di fo ho pe ec pr no ct us ac ot il tr ly nc et ut ss so rs
un lo wa ge ie wh ee wi em ad ol rt po we na ul ni ts mo ow pa im mi ai sh ir su id os iv ia am fi ci vi pl ig tu ev ld
ry mp fe bl ab gh ty op wo sa ay ex ke fr oo av ag if ap gr od bo sp rd do uc bu ei ov by rm ep tt oc fa ef cu rn sc gi
da yo cr cl du ga qu ue ff ba ey ls va um pp ua up lu go ht ru ug ds lt pi rc rr eg au ck ew mu br bi pt ak pu ui rg ib
tl ny ki rk ys ob mm fu ph og ms ye ud mb ip ub oi rl gu dr hr cc tw ft wn nu af hu nn eo vo rv nf xp gn sm fl iz ok nl
my gl aw ju oa eq sy sl ps jo lf nv je nk kn gs dy hy ze ks xt bj"""
_TRIGRAMS = """the and ing ion tio ent ati for her ter hat tha ere ate his con res ver all ons nce men ith ted ers pro
thi wit are ess not ive was ect rea com eve per int est sta cti ica ist ear ain one our iti rat"""
_AFFIXES = """ing tion ation ed er ers es ly ment ments ness able ible ity ous ive al ial ful less ence ance est ism ist
ize ise ted ting ally ical ions ings ated ating ure ture age ant ent ory ary ship ward wise"""
_WORDS = """the of and to a in is that for it as was with be by on not he i this are or his from at which but have an
they you were her she there one all we their can has been if more when will would who so no time about up out them
some could what its into than then other only new like also two these any first may people after over most made did
many before must through back years where much your way well down should because each just those how too work life
even world still between own here being under both last never another while same us might great year old day good
use man men make think know take see come get go say said long little very state three part place such again off
called found high every number however during without within against among since around although government company
system public national service business market report information development program research process group health
school city country water family case point home fact right left four five six seven eight nine ten hundred
thousand million percent general important different several large small early later local social political
economic international available including according based known used using became become until along often
always something nothing thing give given house course power war area money story music book room night sound light
form head hand side end line name data model value result support level question problem order change interest why
ask need try turn move play run live believe hold bring happen write provide sit stand lose pay meet include
continue set learn lead understand watch follow stop create speak read allow add spend grow open walk win offer
remember love consider appear buy wait serve die send expect build stay fall cut reach kill remain suggest raise
pass sell require decide return explain hope develop carry break receive agree pull describe show tell feel seem
leave call keep let begin help talk start mean put big best better free full hard human major military next
possible real sure whole young yet already enough far less least likely rather really today together almost
probably actually usually either especially quickly simply clearly recently finally certainly perhaps above across
behind below beyond inside outside toward upon whether though unless yes child children woman women student
students member members word words month months week weeks hour hours minute minutes moment period history art
table door body car street office job team age land food air law idea kind mind friend father mother son daughter
brother sister parent community party study issue answer sense effect care field role rate reason paper policy
price plan term view piece region road voice face eye control director action letter energy science nature
evidence security industry technology computer software network language picture image video film series season
game player club coach match design center centre source example experience education results changes section
council committee board meeting decision court police officer president minister leader election vote campaign
attack army force peace church religion culture society population species animal plant tree river lake sea
island coast north south east west european american british english french german chinese japanese york london
paris january february march april june july august september october november december monday tuesday wednesday
thursday friday saturday sunday short low late hot cold warm dark white black red blue green yellow heavy strong
weak simple easy difficult clear dead similar current common special certain personal private natural medical
financial legal physical final main single various popular recent serious significant specific particular original
modern traditional foreign central basic entire wide deep past future present second third previous following
total average standard global digital environmental approach analysis structure function method theory concept
feature quality range type version account amount cost cause activity authority position property response
situation material product production performance relationship management measure opportunity environment
condition sector character questions numbers therefore whereas went knew took saw came told felt brought began
kept held wrote stood heard meant met ran paid sat spoke lay led grew lost fell sent built understood drew broke
spent rose drove bought wore chose sought threw caught won forgot looked asked worked seemed tried wanted needed
moved lived believed happened turned started showed played opened walked offered added passed reported increased
included received expected produced things person places points systems companies countries stories cities ways
rights groups problems facts hands parts eyes lot lots doors friends sides heads houses able act address admit
adult affect agency agent ago agreement ahead alone anyone anything apply argue arm arrive article artist assume
attention audience author avoid ball bank bar base beat beautiful bed behavior benefit bill bit blood boy budget
camera cancer candidate capital card career catch cell century chair chance charge check choice choose citizen claim
class close collection college color commercial compare concern conference congress contain cover crime cultural
cup customer debate defense degree democratic deny detail determine difference dinner direction discover discuss
disease doctor dog dream drive drop drug eat economy edge effort employee enjoy enter establish evening event
everybody everyone everything exactly executive exist expert fail fear federal feeling figure fill find finish fire
firm fish floor fly focus foot forget forward garden gas girl glass goal gun guy hair happy heart heat hit hospital
hotel huge husband identify imagine impact improve increase indeed indicate individual institution instead
investment involve item itself join key kid kitchen knowledge lawyer leg lie list listen loss machine magazine
maintain manage manager maybe media memory mention message middle mission movement movie nearly necessary news
newspaper nice note notice occur official oil once operation option organization others owner page pain painting
partner patient pattern perform pick pressure pretty prevent professor protect prove purpose quite radio ready
realize recognize record reduce reflect relate religious rest rich rise risk rock rule safe save scene seat seek
senior shake share shoot shot shoulder sign sing skill skin smile soldier someone sometimes song soon sort space
speech sport staff stage star statement stock store strategy stuff style subject success suffer summer surface
tax teacher tend test thank thus tonight top tough town trade training travel treat treatment trial trip trouble
truth usually victim violence visit wall wear weight whatever wife wind window wish wonder worker worry wrong"""


if __name__ == "__main__":
    sys.exit(main())
