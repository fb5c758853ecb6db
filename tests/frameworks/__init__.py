"""Runs written by the real frameworks (Lightning, transformers, tensorboardX, torchrun).

Each ``make_<name>(root)`` trains a tiny CPU model with the real library into ``root``
and returns the training folder; ``corpus.get(name, tmp_path_factory)`` runs it in a
fresh interpreter whose console goes to ``root/train.log`` (as ``python train.py >
train.log 2>&1`` would) and caches one generation per test session.
"""
