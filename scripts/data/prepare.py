#!/usr/bin/env python3
"""Tokenizes documents into k3rt's token shards, with document boundaries and a manifest.

    python3 scripts/data/prepare.py INPUT... --out DIR
        (--tokenizer tokenizer.json | --tiktoken ENCODING)
        [--jsonl-key text] [--doc-sep SEP] [--eot] [--val-fraction 0.1]

INPUT: text files (each one document, or several split at --doc-sep, e.g. a blank line
"\\n\\n") and JSON-lines files (*.jsonl: one document per line, its text under --jsonl-key).
Tokenizers: a Hugging Face tokenizer.json through the `tokenizers` package, or a tiktoken
encoding by name (tiktoken fetches its file once; give a local cache via TIKTOKEN_CACHE_DIR).
--eot ends every document with the tokenizer's end-of-text token (<|endoftext|>, </s>, ...).

Writes DIR/train.bin and DIR/val.bin (llm.c shards: uint16 tokens for vocabularies up to
65536, else uint32), beside each its document boundaries (train.bin.docs, val.bin.docs; see
docs/file-formats.md), and DIR/manifest.json: the tokenizer, every source file (bytes, sha256,
documents, tokens) and every shard (documents, tokens). The last --val-fraction of the
documents (rounded half up; at least one) is the validation split. Use the shards with
    data = { tokenizer = "shards", train = "DIR/train.bin", val = "DIR/val.bin" }
"""
import argparse
import hashlib
import json
import os
import struct
import sys
import time

SHARD_MAGIC = {2: (20240520, 1), 4: (20240801, 7)}
DOCS_MAGIC, DOCS_VERSION = 20261202, 1
HEADER_INTS = 256
BATCH_DOCS = 256


class Progress:
    """A progress bar on stderr over the input bytes (tqdm-like, no dependency)."""

    def __init__(self, total, quiet):
        self.total, self.done, self.quiet, self.t0, self.last = max(total, 1), 0, quiet, \
            time.time(), 0.0

    def update(self, n, tokens):
        self.done += n
        now = time.time()
        if self.quiet or (now - self.last < 0.2 and self.done < self.total):
            return
        self.last = now
        frac = min(self.done / self.total, 1.0)
        bar = "#" * int(30 * frac)
        rate = tokens / max(now - self.t0, 1e-9)
        sys.stderr.write(f"\r[{bar:<30}] {100 * frac:5.1f}% {self.done / 1e6:.1f}/"
                         f"{self.total / 1e6:.1f} MB {tokens:,} tokens {rate / 1e3:,.0f}k tok/s")
        if self.done >= self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def load_tokenizer(args):
    """(name, vocab size, eot id or None, encode(list of str) -> list of lists of int)."""
    if args.tokenizer:
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(args.tokenizer)
        eot = None
        for name in ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>"):
            eot = tok.token_to_id(name)
            if eot is not None:
                break

        def encode(texts):
            return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
        return os.path.abspath(args.tokenizer), tok.get_vocab_size(), eot, encode
    import tiktoken
    enc = tiktoken.get_encoding(args.tiktoken)
    return f"tiktoken:{args.tiktoken}", enc.n_vocab, enc.eot_token, enc.encode_ordinary_batch


def documents(path, key, sep):
    """The documents of one input file, with the bytes each stands for (for the progress)."""
    if path.endswith(".jsonl"):
        with open(path, "rb") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    doc = json.loads(line)
                except json.JSONDecodeError as e:
                    raise SystemExit(f"{path}:{lineno}: not JSON: {e}")
                if not isinstance(doc, dict) or not isinstance(doc.get(key), str):
                    raise SystemExit(f"{path}:{lineno}: expected an object with a string "
                                     f"'{key}' (--jsonl-key)")
                yield doc[key], len(line)
        return
    with open(path, encoding="utf-8") as f:
        text = f.read()
    parts = text.split(sep) if sep else [text]
    for i, part in enumerate(parts):
        if part.strip():
            yield part, len(part.encode("utf-8")) + (len(sep) if sep and i else 0)


def tokenize(args, encode, eot):
    """Every document's tokens in input order, and each source's record for the manifest."""
    total = sum(os.path.getsize(p) for p in args.inputs)
    bar = Progress(total, args.quiet)
    docs, sources, n_tokens = [], [], 0
    for path in args.inputs:
        with open(path, "rb") as f:
            sha = hashlib.sha256(f.read()).hexdigest()
        rec = {"path": path, "bytes": os.path.getsize(path), "sha256": sha, "documents": 0,
               "tokens": 0}
        batch, batch_bytes = [], 0

        def flush():
            nonlocal n_tokens, batch, batch_bytes
            for ids in encode(batch):
                if args.eot:
                    ids = ids + [eot]
                if ids:
                    docs.append(ids)
                    rec["documents"] += 1
                    rec["tokens"] += len(ids)
                    n_tokens += len(ids)
            bar.update(batch_bytes, n_tokens)
            batch, batch_bytes = [], 0

        for text, nbytes in documents(path, args.jsonl_key, args.doc_sep):
            batch.append(text)
            batch_bytes += nbytes
            if len(batch) >= BATCH_DOCS:
                flush()
        flush()
        sources.append(rec)
    bar.update(total - bar.done, n_tokens)
    return docs, sources


def write_split(path, docs, width):
    """One shard and its .docs file; returns (documents, tokens)."""
    n = sum(len(d) for d in docs)
    if n < 2 or n > 2**31 - 1:
        raise SystemExit(f"{path}: {n} tokens; a shard holds 2 to 2^31 - 1")
    magic, version = SHARD_MAGIC[width]
    header = [0] * HEADER_INTS
    header[0:3] = [magic, version, n]
    fmt = "<H" if width == 2 else "<I"
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack(f"<{HEADER_INTS}i", *header))
        for d in docs:
            f.write(struct.pack(f"<{len(d)}{fmt[1]}", *d))
    os.replace(path + ".tmp", path)
    starts = [0]
    for d in docs:
        starts.append(starts[-1] + len(d))
    header = [0] * HEADER_INTS
    header[0:4] = [DOCS_MAGIC, DOCS_VERSION, len(docs), n]
    with open(path + ".docs.tmp", "wb") as f:
        f.write(struct.pack(f"<{HEADER_INTS}i", *header))
        f.write(struct.pack(f"<{len(starts)}q", *starts))
    os.replace(path + ".docs.tmp", path + ".docs")
    return len(docs), n


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("inputs", nargs="+")
    ap.add_argument("--out", required=True)
    tok = ap.add_mutually_exclusive_group(required=True)
    tok.add_argument("--tokenizer", help="a Hugging Face tokenizer.json")
    tok.add_argument("--tiktoken", help="a tiktoken encoding name, e.g. gpt2, cl100k_base")
    ap.add_argument("--jsonl-key", default="text")
    ap.add_argument("--doc-sep", default=None,
                    help="split text files into documents at this string (\\n is a newline)")
    ap.add_argument("--eot", action="store_true", help="end each document with end-of-text")
    ap.add_argument("--val-fraction", type=float, default=0.1)
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    if args.doc_sep is not None:
        args.doc_sep = args.doc_sep.encode().decode("unicode_escape")
    if not 0 < args.val_fraction < 1:
        raise SystemExit(f"--val-fraction must be in (0, 1), got {args.val_fraction}")
    name, vocab, eot, encode = load_tokenizer(args)
    if args.eot and eot is None:
        raise SystemExit(f"{name}: no end-of-text token (<|endoftext|>, </s>, ...) for --eot")
    docs, sources = tokenize(args, encode, eot)
    if len(docs) < 2:
        raise SystemExit(f"{len(docs)} document(s): the train and validation splits need one "
                         "each (split text files with --doc-sep)")
    n_val = min(max(1, int(len(docs) * args.val_fraction + 0.5)), len(docs) - 1)
    width = 2 if vocab <= 65536 else 4
    os.makedirs(args.out, exist_ok=True)
    shards = []
    for split, part in (("train", docs[:-n_val]), ("val", docs[-n_val:])):
        path = os.path.join(args.out, f"{split}.bin")
        d, n = write_split(path, part, width)
        shards.append({"file": f"{split}.bin", "split": split, "documents": d, "tokens": n,
                       "token_bytes": width})
    manifest = {
        "format": 1, "tokenizer": name, "vocab_size": vocab, "eot": eot if args.eot else None,
        "doc_sep": args.doc_sep, "jsonl_key": args.jsonl_key, "sources": sources,
        "shards": shards, "documents": len(docs), "tokens": sum(s["tokens"] for s in shards),
    }
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
    if not args.quiet:
        print(f"{args.out}: {manifest['documents']} documents, {manifest['tokens']} tokens "
              f"(train {shards[0]['tokens']}, val {shards[1]['tokens']}), vocabulary {vocab}")


if __name__ == "__main__":
    main(sys.argv[1:])
