#!/usr/bin/env python3
"""Trains the small byte-level BPE tokenizer checked in as tests/fixtures/tokenizer.json
(once; CI reads the file and downloads nothing):

    python3 scripts/data/make_test_tokenizer.py [--vocab 512] [--out tests/fixtures/tokenizer.json]

on data/tinyshakespeare.txt with the `tokenizers` package (scripts/setup.sh installs it into
.deps/python). `<|endoftext|>` is token 0: prepare.py can end every document with it.
"""
import argparse
import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "tokenizer.json"))
    a = ap.parse_args()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=a.vocab, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train([os.path.join(ROOT, "data", "tinyshakespeare.txt")], trainer)
    tok.save(a.out)
    print(f"{a.out}: vocabulary {tok.get_vocab_size()}")


if __name__ == "__main__":
    main()
