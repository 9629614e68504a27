"""English beside the Chinese: translations only for the exact text they translate, glosses per character."""
import pytest

from kvlib.notebook.english import GLOSSES, NO_ENGLISH, TRANSLATIONS, english, glossed
from kvlib.tokenizer import is_ideograph


def test_a_stored_text_gets_its_translation_and_any_other_text_says_none_is_stored():
    text, translation = next(iter(TRANSLATIONS.items()))
    assert english(text) == translation
    assert english(text + "。") == NO_ENGLISH          # one character more: another text
    assert english(text[:-1]) == NO_ENGLISH
    assert english("") == NO_ENGLISH


def test_every_translation_is_chinese_text_to_english():
    for text, translation in TRANSLATIONS.items():
        assert sum(map(is_ideograph, text)) >= 2, text
        assert translation and not any(map(is_ideograph, translation)), text
        assert translation == translation.strip() and "  " not in translation, text


def test_glosses_name_each_character_and_leave_unknown_ones_alone():
    assert glossed("流长") == f"流 {GLOSSES['流']} · 长 {GLOSSES['长']}"
    assert glossed(iter(["流", "龘"])) == f"流 {GLOSSES['流']} · 龘"
    assert glossed("") == ""
    assert all(len(ch) == 1 and gloss and not any(map(is_ideograph, gloss)) for ch, gloss in GLOSSES.items())


@pytest.mark.parametrize("bad", [None, 7, b"\xe6\xb5\x81", ["流"]])
def test_english_refuses_what_is_not_text(bad):
    with pytest.raises(TypeError, match="text must be a str"):
        english(bad)


@pytest.mark.parametrize("bad, message", [(["流长"], "one-character strs"), ([7], "one-character strs"),
                                          (5, "got int"), (b"ab", "got bytes"), ("\ud800", "not valid Unicode")])
def test_glossed_refuses_what_is_not_characters(bad, message):
    with pytest.raises((TypeError, ValueError), match=message):
        glossed(bad)


def test_the_widgets_poems_carry_their_english_or_say_none_is_stored():
    """Notebooks 2 and 3's widgets show a poem's English under it, as every printed poem does."""
    import html as html_module

    from kvlib.notebook.acrostic_writer import AcrosticView
    from kvlib.notebook.english import NO_ENGLISH, TRANSLATIONS
    from kvlib.notebook.sampling_explorer import poem_html

    start = "春风送客去，江树送君归。江海多佳赏，江云不可期。\n南国有时逢，春风生"
    assert html_module.escape(TRANSLATIONS[start]) in poem_html("春风", start[2:])
    assert html_module.escape(NO_ENGLISH) in poem_html("春风", "吹白日")
    poem = "春色春色春如柳，眠花暮艳春如雾。不胜东山有人隔，觉宜西风相送客。"
    view = AcrosticView(heads="春眠不觉", chars_per_line=7, poem=poem)
    assert "→ " + html_module.escape(TRANSLATIONS[poem]) in view.html()
