"""Barlow Twins and a uniformity plug-in for augssl, from a package of their own (docs/extending.md)."""
