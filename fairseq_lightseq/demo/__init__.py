"""The demo: `python -m fairseq_lightseq.demo` (see __main__.py) on the corpus of corpus.py."""
