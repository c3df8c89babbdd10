"""attnstudy: is this seq2seq model's attention an explanation?"""

__version__ = "0.1.0"
