"""Command-line tools of hils-swa: ``hils-swa conform | bench | diff | probe``."""
