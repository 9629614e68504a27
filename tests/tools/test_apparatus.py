"""The rules that separate a poem from its editors' apparatus, on passages taken from the real data."""
from __future__ import annotations

import pytest

from kvlib.tools.apparatus import separate, strip_bracketed_notes, trailing_notes_start


def test_a_note_in_brackets_is_removed():
    result = separate("晚樹參差碧，奇峰邐迤晴。（見《金石萃編》卷一百五。）")
    assert result.text == "晚樹參差碧，奇峰邐迤晴。"
    assert result.fired == {"notes in brackets": len("（見《金石萃編》卷一百五。）")}


def test_a_note_nested_in_a_note_goes_with_it():
    # poem 51046: a 〖1〗 footnote inside a （…） note, itself quoting 《…》 and 「…」
    text = "寂寂空巖畔，千秋迹已陳。（同前。）（〖1〗《洞霄圖志》卷四《古跡門·伏虎巖》條：「伏虎巖，在宮山西南」）"
    assert separate(text).text == "寂寂空巖畔，千秋迹已陳。"
    kept, notes = strip_bracketed_notes("甲（乙〖丙（丁）〗戊）己")
    assert (kept, notes) == ("甲己", ["（乙〖丙（丁）〗戊）"])


def test_an_unclosed_note_runs_to_the_end():
    kept, notes = strip_bracketed_notes("梵宇千花裏，秋聲萬籟齊。（見《金石萃編》")
    assert kept == "梵宇千花裏，秋聲萬籟齊。"
    assert notes == ["（見《金石萃編》"]


def test_an_emendation_keeps_its_character_and_footnote_markers_go():
    # poem 50362: [春] is a supplied character, [二七] a footnote marker
    result = separate("池草三[二七]攢別，能芳二月[春]。")
    assert result.text == "池草三攢別，能芳二月春。"
    assert result.fired == {"footnote markers": 4, "emendation brackets": 2}


def test_the_footnotes_after_the_verse_start_at_a_markers_second_use():
    text = "鳳凰詔書[一]猶未到，滿城戈甲如雲屯。[一]「詔」，甲卷作「詞」。"
    assert trailing_notes_start(text) == text.index("[一]「")
    assert separate(text).text == "鳳凰詔書猶未到，滿城戈甲如雲屯。"


def test_a_note_after_the_verse_starting_with_an_an_is_cut():
    text = "可憐谷隱孜禪伯，被唾如今見亦羞。按：《全唐詩》卷八一○收此首，缺題，今重錄。"
    assert separate(text).text == "可憐谷隱孜禪伯，被唾如今見亦羞。"


def test_a_sentence_citing_a_source_is_cut_but_a_title_in_the_verse_stays():
    cited = "紅殘翠碎花樓下，金谷千年更不春。見《太平廣記》卷四八九引。"
    assert separate(cited).text == "紅殘翠碎花樓下，金谷千年更不春。"
    titled = "誰家靜捻參差管，一曲《霓裳》學鳳清。"
    assert separate(titled).text == "誰家靜捻參差管，一曲霓裳學鳳清。"


def test_quotation_marks_go_and_their_words_stay():
    text = "路旁忽見如花人，獨向綠楊陰下歇。「借問女郎何處來？」含嚬欲語聲先咽。"
    assert separate(text).text == "路旁忽見如花人，獨向綠楊陰下歇。借問女郎何處來？含嚬欲語聲先咽。"


@pytest.mark.parametrize("text, reason", [
    ("落葉蕭蕭□杳□，送師言了意未了。", "lost characters (□)"),
    ("（上缺）幽巖有香。", "a note says the text has a gap"),
    ("撫幽巖，有香。（此句缺一字）", "a note says the text has a gap"),
    ("見事如不見，終身無過{彳|天天/心}。", "characters Unicode lacks ({…})"),
    ("孟子終焉處，⿰木養深黃狖小。", "characters Unicode lacks ({…})"),
    ("（見《全唐詩》卷一。）", "only notes"),
    ("", "no text"),
])
def test_poems_that_cannot_be_written_whole_are_dropped(text, reason):
    result = separate(text)
    assert (result.text, result.dropped) == (None, reason)


def test_a_gap_filled_from_a_source_keeps_the_poem():
    assert separate("風送香。（缺字據《永樂大典》補）").text == "風送香。"


def test_editors_prefaces_are_dropped_by_title():
    assert separate("李唐以文學第士，尤重聲律。", title="自序").dropped == "editors' front or back matter"
    assert separate("到蜀，途中經歷。", title="到蜀後記途中經歷").text == "到蜀，途中經歷。"


def test_punctuation_left_doubled_by_a_note_is_collapsed():
    assert separate("白日依山盡，黃河入海流。（同前）。").text == "白日依山盡，黃河入海流。"
