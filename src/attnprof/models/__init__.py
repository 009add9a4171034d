"""The models `attnprof model` profiles: transformers models built from a config (`hf`), factory models
(`factory`), the implementation names (`implementations`), and the bridge that runs an attnprof variant
inside a transformers model (`bridge`). Nothing here imports torch or transformers at import time.
"""
