"""Trains a byte-level BPE tokenizer (32,000 tokens, like Llama 2's vocabulary size) on the
Python standard library's sources and saves it as tokenizer.json: a stand-in of realistic
size for a model's tokenizer, made offline (no model download)."""
import glob, os, sys, sysconfig
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

texts = []
for f in sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "**/*.py"), recursive=True))[:2000]:
    try:
        texts.append(open(f, encoding="utf-8").read())
    except (UnicodeDecodeError, OSError):
        pass
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator(texts, trainers.BpeTrainer(
    vocab_size=32000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
tok.save(sys.argv[1])
