"""The warning class for notes that belong in a run's row: a leaf every module may import."""


class TpubenchWarning(UserWarning):
    """A note about a run that belongs in its row (``warnings`` column), e.g. an unknown peak."""
