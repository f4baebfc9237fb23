"""Reviewer names: what a review record keeps of a name, and when two names are one person.

Names are self-declared (nothing here authenticates anyone); the rules make two names that look
the same be the same name, so one person cannot approve twice under look-alike names."""

from __future__ import annotations

import unicodedata

from dprelease.catalog.errors import CatalogError

MAX_REVIEWER_LENGTH = 128


def normalize_reviewer(reviewer: str) -> str:
    """NFKC-normalised, stripped, visible and non-empty: the name a review record keeps.

    Refused: control and format characters (zero-width spaces and joiners, bidi overrides, soft
    hyphens), separators other than a space, and the invisible default-ignorable code points that
    Unicode files as letters or marks (Hangul fillers, the combining grapheme joiner, variation
    selectors): two names that look the same must be the same name.
    """
    name = unicodedata.normalize("NFKC", str(reviewer)).strip()
    if not name:
        raise CatalogError("reviewer must name a person (got an empty string)")
    if len(name) > MAX_REVIEWER_LENGTH:
        raise CatalogError(
            f"reviewer must be at most {MAX_REVIEWER_LENGTH} characters (got {len(name)})"
        )
    for position, char in enumerate(name):
        kind = _invisible_kind(char)
        if kind is not None:
            raise CatalogError(
                f"reviewer {name!r} must be printable text: character U+{ord(char):04X} "
                f"({unicodedata.name(char, 'unnamed')}) at position {position} is not printable "
                f"({kind})"
            )
    return name


def same_person(first: str, second: str) -> bool:
    """Do two (normalised) names name the same person?  Case and spacing do not count."""
    return " ".join(first.casefold().split()) == " ".join(second.casefold().split())


# Default_Ignorable_Code_Point (Unicode DerivedCoreProperties) outside the categories
# ``str.isprintable`` already refuses: rendered as nothing.
_DEFAULT_IGNORABLE = (
    (0x034F, 0x034F),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180B, 0x180F),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFFA0, 0xFFA0),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)
_CATEGORY_KINDS = {
    "Cc": "a control character",
    "Cf": "a format character: invisible",
    "Cs": "a surrogate",
    "Co": "a private-use character",
    "Cn": "an unassigned code point",
    "Zl": "a line separator",
    "Zp": "a paragraph separator",
}


def _invisible_kind(char: str) -> str | None:
    """Why ``char`` may not be part of a name, or None.  O(1)."""
    if char == " ":
        return None
    category = unicodedata.category(char)
    if category in _CATEGORY_KINDS:
        return _CATEGORY_KINDS[category]
    if category == "Zs":
        return "a space other than U+0020"
    code = ord(char)
    if any(low <= code <= high for low, high in _DEFAULT_IGNORABLE):
        return "a default-ignorable character: invisible"
    if code == 0x2800:  # BRAILLE PATTERN BLANK: a symbol that renders as a blank
        return "a blank symbol: invisible"
    return None
