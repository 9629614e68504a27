"""English beside the Chinese the notebooks print: glosses of single characters, and translations
of whole texts, each kept for the exact text it translates.

What the model writes depends on its weights, the seed and, through float rounding, the processor. A
translation is shown only beside the text it was made for; any other text gets :data:`NO_ENGLISH`,
never the English of a text that is not there.
"""
from __future__ import annotations

import html

from ..checks import check_text

NO_ENGLISH = "(no English is stored for this text: this machine wrote another text than the one translated here)"

GLOSSES = {  # a character's commonest sense in these poems
    "流": "flow", "长": "long", "空": "empty; sky", "深": "deep", "多": "many", "来": "come", "清": "clear", "平": "level",
    "人": "person", "花": "flower", "尘": "dust", "月": "moon", "天": "sky", "游": "roam", "山": "mountain",
    "生": "grow; life", "吹": "blow", "送": "see off", "不": "not", "起": "rise", "一": "one", "日": "sun; day",
    "何": "what; why", "满": "full", "有": "have; there is", "无": "without", "见": "see", "白": "white", "遥": "far off",
    "间": "between", "边": "edge", "难": "hard", "楼": "tower", "看": "look at", "枝": "branch", "雨": "rain",
    "尽": "end; all gone", "落": "fall", "明": "bright", "夜": "night", "照": "shine on", "飞": "fly", "中": "middle; in",
    "霜": "frost", "光": "light", "风": "wind", "春": "spring", "秋": "autumn", "水": "water", "江": "river",
    "河": "river", "云": "cloud", "声": "sound", "心": "heart", "归": "return", "去": "go", "青": "green",
    "思": "long for", "入": "enter", "海": "sea", "远": "far", "寒": "cold", "是": "is", "地": "ground", "上": "on; up",
    "头": "head", "望": "gaze", "低": "lower", "故": "old; former", "乡": "home", "。": "full stop", "，": "comma",
    "知": "know", "处": "place", "相": "each other", "独": "alone", "在": "be at", "异": "strange", "客": "guest; stranger",
    "为": "be; for", "安": "peace", "别": "part from", "片": "piece; a stretch of",
    "自": "self; from", "今": "now", "玉": "jade", "未": "not yet", "高": "high", "此": "this", "欲": "wish to",
    "谁": "who",
}

TRANSLATIONS = {  # the text as the model wrote it (its line breaks included) -> English
    "独在异乡为异客，不知何处是长安。\n一片":
        "Alone in a strange land, a stranger, I do not know where Chang'an [the capital] lies. / A stretch of... "
        "(cut off)",
    "一朝荣辱在天涯，一日无人不自知。":
        "One morning's honour or disgrace lies at the end of the world; in a single day there is no one who "
        "does not know himself.",
    "新年一日见花开，今日春风送客来。":
        "On a day of the new year I see the flowers open; today the spring wind brings a guest.",
    "春风吹白日，江水上清风。":
        "The spring wind blows on the bright sun; over the river water, a clear breeze.",
    "中朝荣汉赐簪缨，堆草嵯峨甘节霜。为杀西飞东蜀国，不知前事醉交游。":
        "At court, Han honours grant hatpins and tassels; heaped grass, towering, content with the season's "
        "frost. For slaying, flying west to the eastern land of Shu; not knowing what went before, drunk "
        "among friends. (Each line makes sense of a kind; together they do not.)",
    "新添文字外，突兀海霜开。笋影攒沾席，风词软损情。欲将黔首上，采得涸鱼来。欲卧秋烟里，修悲"
    "过鴈行。愚人徒击警，时子我耕笼。茱萸同藻翰，车马漫虬皴。乍觉慙栖杼，迟迟问樊邓。沙澜响卑"
    "壑，巴潦湿旧滋。电胆不唾岿，鱼鳞任濯缨。砺兵驱不得，锦帐驻还还。飞皙羽觞发，雄胡":
        "Beyond the newly added words, sea frost opens, towering. Bamboo shadows gather on the mat; words of "
        "wind soften and wound the heart. I would raise the common folk; I gather fish from a dried pond... "
        "(and on for sixteen more lines, many of them words without sense, the last cut off after two "
        "characters)",
    "岳岳凉风汲，江山惠宴焚。何须朝僧去，为见六仙亲。霁色凝天外，春声似月中。":
        "Peak on peak, the cool wind draws water; rivers and hills, a feast of favour burns. Why must I go to "
        "the monk at dawn? To see the six immortals close. The colour after rain hardens beyond the sky; the "
        "sound of spring seems to come from the moon.",
    "中色荣衰痛店妻，堆书嵯翠甘牵掇。缘杀西飞载泾鹫，不盖前山醉潇翅。此达楞伽绝迷迦，正薛峦崖"
    "作柴谷。鲁昴节阵峨耻兵，几来孰敢跕甽虎。骑重来三缺玉京，孥欲爷缟衣囊内。李四有功先恩警，"
    "随人莫驰酢口赢顿芙蓉出当战曜，朗得聊检股陈恳碣，爪蹉宠曷得砂馈乍翅，聊葺来侵骨裂":
        "Not sentences any more: 'middle, colour, glory, decline, pain, shop, wife; piled books, rugged, "
        "green, sweet, drag, gather...', then on through rare characters, the lines losing their length.",
    "新添文字婉澘突，宜客思吟笋骈然。涧泽导词衔磈束，给榆黔壮上峒逅。涸刀山撑欲自练，谏耋修话"
    "过尤馥。愚分师击望争殚，我挂俄新茱笑孔。野钓车酴遭虬皴，乍嚼柿幕杼填践。迎樊东堂矜悦𬪩卑"
    "寒声巴交与旧愧应电胆不唾岿约姿。调工厦悬砺入翁，未察锦练腾鞍鲙。鲛凛羽鼙发灌阳，":
        "Not sentences any more: 'newly added words, graceful, (a rare character), abrupt; fitting, guest, "
        "think, chant, bamboo shoots, side by side...', then on through rare characters.",
    "岳秀凉华字邻寺，闽州牧鸳巢嵌。僧形俗老鹤，僧参舂霁烟。天章些偕葛费虵拳，五炭枝星渡燕条。"
    "琴鹤恋云骚客静，客敲姥赍迈恩痕，将稽法饵比灵藩。笋帏晓蝶犯萧铮，金翠轻抽护巷遮。展褐缀纹"
    "当聒咳，漉添澄浊六钱凫。嘉槎苞拌忘轻卑，几菰瑇仕各矫浙观呼众凫，康径痎林人已辀。":
        "Not sentences any more: 'peak, fair, cool, splendour, word, neighbouring temple; Min prefecture, "
        "herd, duck, nest, inlay...', then on through rare characters, lines of five, six, seven and more.",
    "春风归荇蔓，晚雨出郊梅。阔客悲惊雁，轻舟恋岳鱼。芦洲":
        "The spring wind returns to the floating-heart vines; evening rain brings out the plum trees of the "
        "outskirts. The far traveller grieves at the startled geese; the light boat longs for the mountain "
        "fish. The reed isle... (cut off: 24 new tokens)",
    "春风归尽景沈沈，湖气洗情深寄稀。一蝉一雁暮，万里一山":
        "The spring wind has all gone home, the scene sinks deep; the lake's air washes the heart, deep, and "
        "letters are few. One cicada, one goose, at dusk; ten thousand li, one mountain... (cut off: 24 new "
        "tokens)",
    "春风筝瑟怨经冬，岳色衫情自有情。":
        "The spring wind: the zheng and se zithers lament the winter gone by; the mountains' colour, the "
        "feeling of a robe, a feeling all its own.",
    "春风结二宫。鸳鸯闲日暮食蒙，谁知明春归路东。":
        "The spring wind ties the two palaces together. Mandarin ducks idle at the end of the day, feeding in "
        "the haze; who knows that next spring the road home runs east?",
    "万事何处见君去，万里无心不识心。谁道西飞东去国，不劳飞雪向东流。":
        "Of all the world's affairs, where shall I see you leave? Ten thousand li without intent, not knowing "
        "the heart. Who says that flying west one leaves the land to the east? No need for the flying snow to "
        "flow east.",
    "万方如玉节，百年为谁开。此去未到此，空传今夕情。明时长叹息，此日不能来。何况青楼上，空悲"
    "一鴈愁。":
        "All the lands are like tallies of jade; for whom do a hundred years open? Going from here, not yet "
        "arrived here, tonight's feeling is passed on in vain. In a bright age I sigh long; this day cannot "
        "come. How much more, up in the blue mansion, grieving in vain at one wild goose's sorrow.",
    "春山南去日，江柳西归家。柳映行人去，花知别母愁。云帆一点尽，霜露几沾沾。":
        "Spring hills, the day I went south; river willows, going home to the west. The willows mirror the "
        "traveller leaving; the flowers know the sorrow of parting from a mother. The cloud-white sail "
        "dwindles to a point; how often frost and dew soak and soak.",
    "中色荣衰痛店妻，堆书卓职甘颓图。缘贪失藉常和悲，不失前方泪盈翅。此达喧娇绝针线，正知时长"
    "作行肠。鲁苏节阵略耻兵，几遍孰敢宜名役。骑重名勅遮御酒，从避衫绮交不识。李四作西先恩血，"
    "随人莫驰史口赢顿钱。哭当战戍土夜战聊置股，语尽豪场总栖笼碍绝各潸，岂清愁来莫停蹄":
        "Not sentences any more: 'middle, colour, glory, decline, pain, shop, wife; piled books, lofty "
        "office, sweet, ruined plans...', then on through rare characters, the lines losing their length.",
    "新添文字婉澘突，宜客思吟笋骈然。涧泽导词衔蟋蟀，讼榆黔壮上抖逅。涸贱山撑苏自练，谏耋麋足"
    "过尤馥。愚分徒击望争殚，我挂俄新阅笑孔。野钓车樯蛟虬皴，乍嚼慙疑杼镝灭。迎樊东堂矜悦趣，"
    "开声巴貉与旧愧。电胆不唾科位姿，调工始悬砺入螭。未察锦练腾鞍鲙，鲛称羽觞发灌输。":
        "Not sentences any more: 'newly added words, graceful, (a rare character), abrupt; fitting, guest, "
        "think, chant, bamboo shoots, side by side...', then on, seven characters a line, without sense.",
    "岳秀凉华字邻寺，闽州牧鸳巢。朝僧形俗过博日，亲舂野菜抄名章。潇洒似虵麤省咒，枝碎休䯄蹇仑"
    "琴。金苍骚客未为客，却闻栖径雨声将。法双工钵侵宵笋，禅子苔恩护柄金。锦骥护身交缇展，缀鼇"
    "当口跪金漉。澄巡六十凫扈，海暖烟清陁殿爰几方君步祀，浙观冰枯潋醑康。谷林人众芙蓉":
        "Not sentences any more: 'peak, fair, cool, splendour, word, neighbouring temple; Min prefecture, "
        "herd, mandarin-duck nest...', then on through rare characters, lines of five, six, seven and more.",
    "床前明月光，一夜一灯明。\n一夜一夜夜，一夜一灯明。\n一夜一夜月，一夜一夜明。\n一夜一夜月"
    "，一夜一夜明。\n一夜一夜夜，一夜一声声。\n一夜一夜月，一夜一夜明。\n一夜一夜月，一夜一夜"
    "明。\n一夜一夜月，一夜一夜长。\n一":
        "Before my bed, the bright moonlight; one night, one lamp bright. / One night, one night, night; one "
        "night, one lamp bright. / One night, one night, moon; one night, one night, bright. ... (the same "
        "few words, over and over)",
    "大漠孤烟直，高低万里行。风吹寒草色，风卷古松声。\n一径青苔上，千峰白石头。\n一径青青草，"
    "千峰白石桥。\n一径青青草，千峰白石桥。\n一径春风起，千峰万壑深。\n一径青青草，千峰白石桥"
    "。\n一径春风起，千峰万仞峰。\n一径":
        "In the vast desert a lone smoke rises straight; high and low, ten thousand li of road. The wind "
        "blows the colour of cold grass; the wind rolls the sound of old pines. / A path up the green moss; a "
        "thousand peaks, white stone. / A path of green, green grass; a thousand peaks, a white stone bridge. "
        "... (that couplet again and again, a word changed here and there)",
    "人工智能好，不识不知音。\n一生无一事，一念无生死。不知无生生，不知无生死。\n一生不生死，"
    "一生无一事。\n一生无一事，一生无一事。\n一生无一事，一生无一事。\n一生无一事，一生无一事"
    "。\n一生无一事，一生无一事。\n一日":
        "Artificial intelligence is good; it knows no one, knows no friend who knows its tune. / A whole life "
        "without one affair; one thought without life or death. ... ('a whole life without one affair', over "
        "and over)",
    "春色春色春如柳，眠花暮艳春如雾。不胜东山有人隔，觉宜西风相送客。":
        "Spring colour, spring colour, spring like the willows; sleeping among flowers, the dusk's splendour, "
        "spring like mist. I cannot bear it: someone cut off beyond the eastern hills; I feel the west wind "
        "is right for seeing a guest off.",
    "学士安承命，无文设汉家。止醪犹忆酒，境地亦怜僧。":
        "The scholar calmly takes his orders; without letters he sets up the house of Han. Giving up the wine "
        "he still remembers drinking; in this place he pities the monk too.",
    "中山岳色添秋水，凉露浓荷带夕泉。共爱东山终始到，自缘西海两何为。":
        "At Zhongshan the mountains' colour deepens the autumn water; cool dew, thick lotus, the evening "
        "spring. Together we love the eastern hills, reached in the end; on our own, by the western sea, what "
        "are the two of us for?",
    "大漠孤烟直落花，便添秋水去沿沿。独携白日簪裾下，突兀红灯向月宜。":
        "In the vast desert a lone smoke rises straight, falling flowers; then adds the autumn water, flowing "
        "on and on. Alone I carry the bright day down in hatpin and robe; towering, the red lamp suits the "
        "moon. (The prompt's five-character line has grown to seven.)",
    "中山岳色添，高鸟凉风吹。人生多客发，妻子亦相寻。":
        "At Zhongshan the mountains' colour deepens; high birds, the cool wind blows. In a life one often "
        "sets out as a traveller; wife and children come looking too.",
    "床前看月光，中有岳色添。\n闻":
        "Before my bed I look at the moonlight; in it, the mountains' colour deepens. / I hear... (cut off: 8 "
        "steps)",
    "春风落尽柳枝高，今日春风一夜凉。今日独游西上客，今年不见楚山水。":
        "The spring wind has blown everything down, the willow branches high; today's spring wind, one cool "
        "night. Today I roam alone, a guest going up west; this year I do not see the hills and waters of "
        "Chu.",
    "白日依山尽，新春去路长。山阴临树暗，水影入楼斜。风竹藏新垒，霜榆绕远沙。此时知几日，何处"
    "泪痕痕。":
        "The white sun sinks behind the hills; new spring, the road ahead is long. North of the hills, by the "
        "trees, it is dark; the water's reflection slants into the tower. Windblown bamboo hides new "
        "ramparts; frosted elms ring the far sands. Who knows, at this hour, how many days; where are the "
        "traces of tears, traces?",
    "床前看月光，疑是地上霜。":
        "Before my bed I look at the moonlight; I take it for frost upon the ground.",
    "四顷是非遗委伴，寄诗来见饥鹭生。不为流水到江上，曾愁不言旧事":
        "Four fields of right and wrong, left to companions; I send a poem, come to see a hungry egret live. "
        "Not for flowing water to reach the river; I once grieved, and did not speak of old things... (cut "
        "off: 48 tokens)",
    "床前明月光，一夜一灯明。":
        "Before my bed, the bright moonlight; one night, one lamp bright.",
    "大漠孤烟直，高低万里行。风吹寒草色，风卷古松声。":
        "In the vast desert a lone smoke rises straight; high and low, ten thousand li of road. The wind "
        "blows the colour of cold grass; the wind rolls the sound of old pines.",
    "人工智能好，不识不知音。":
        "Artificial intelligence is good; it knows no one, knows no friend who knows its tune.",
    "床前明月光中色，窗里红花眼中草。翠微烟暖花前色，不得和香满城里。":
        "Before my bed, the bright moonlight, colour in its midst; red flowers at the window, grass within "
        "the eye. Green haze, warm mist, the colour before the flowers; I cannot bring their scent to fill "
        "the town. (The prompt's five-character line has grown to seven.)",
    "大漠孤烟直欲飞，暮峰危突隔层层。白云犹有沾衣泽，红树空余向郭门。":
        "In the vast desert a lone smoke rises straight, as if to fly; the evening peaks jut steeply, layer "
        "beyond layer. The white clouds still hold dew to wet a robe; the red trees, left in vain, face the "
        "city gate. (The prompt's five-character line has grown to seven.)",
    "人工智能好，世代名字绝。世上无此书，真知僧形现。":
        "Artificial intelligence is good; through the generations its name is cut off. In the world there is "
        "no such book; true knowledge appears in a monk's form.",
    "白日依山尽，黄河入海流。欲穷千里外，不见一峰前。\n一径青青树，千峰白石桥。人间无事事，不"
    "是有人知。\n一径青苔上，千峰白石头。\n一径青苔上，千峰白石中。\n一径云":
        "The white sun sinks behind the hills; the Yellow River flows into the sea. To see beyond a thousand "
        "li: not one peak ahead. / A path of green, green trees; a thousand peaks, a white stone bridge. "
        "Among men there is nothing to do; it is not that anyone knows. / A path up the green moss; a "
        "thousand peaks, white stone. / A path up the green moss; a thousand peaks, amid white stone. / A "
        "path, cloud... (cut off)",
    "白日依山尽，黄河入海流。欲穷千里外，不见一峰前。\n一径青青树，千峰白石桥。人间无事事，不"
    "是有人知。\n一径青苔上":
        "The white sun sinks behind the hills; the Yellow River flows into the sea. To see beyond a thousand "
        "li: not one peak ahead. / A path of green, green trees; a thousand peaks, a white stone bridge. "
        "Among men there is nothing to do; it is not that anyone knows. / A path up the green moss... (cut "
        "off)",
    "白日依山尽，黄河入海流。欲穷千里，不见一枝生。\n一夜江城月，千山万里天。\n一夜江南月，千"
    "山万里天。\n一夜江南月":
        "The white sun sinks behind the hills; the Yellow River flows into the sea. To see a thousand li "
        "(four characters where the line needs five); not one branch grows. / One night, the moon over the "
        "river town; a thousand hills, ten thousand li of sky. / One night, the moon south of the river; a "
        "thousand hills, ten thousand li of sky. / One night, the moon south of the river... (cut off)",
    "白日依山尽，黄河入海流。欲穷千里外，不见月明月明月明月明月明月明月，不见五更无事，不见天"
    "涯。\n一叶，一枝枝。\n":
        "The white sun sinks behind the hills; the Yellow River flows into the sea. To see beyond a thousand "
        "li, not seeing moon bright moon bright moon bright... (moon, bright, over and over in one overlong "
        "line); not seeing the fifth watch, nothing to do; not seeing the sky's edge. / One leaf; branch on "
        "branch.",
    "春风吹柳柳，春色满池塘。\n春色春风起，春光满眼前。\n":
        "The spring wind blows the willows, willows; spring colour fills the pond. / Spring colour, the "
        "spring wind rises; spring light fills the eyes.",
    "白日依山尽，青山出树多。\n一径青青树，千峰白石桥。\n一径春风":
        "The white sun sinks behind the hills; the green hills bring out many trees. / A path of green, green "
        "trees; a thousand peaks, a white stone bridge. / A path, the spring wind... (cut off)",
    "床前看月光，疑是地上霜。\n一夜一夜夜，一夜一灯明。\n一夜一夜月，一夜一灯":
        "Before my bed I look at the moonlight; I take it for frost upon the ground. / One night, one night, "
        "night; one night, one lamp bright. / One night, one night, moon; one night, one lamp... (cut off)",
    "床前明月光，疑是地上霜。自笑身虽薄，谁怜酒亦醒。":
        "Before my bed, the bright moonlight; I take it for frost upon the ground. I laugh at myself, slight "
        "as I am; who pities me, sober even after wine?",
    "床前明月光，疑是地上霜。晓入云无路，寒侵日尽天。":
        "Before my bed, the bright moonlight; I take it for frost upon the ground. At dawn I enter the clouds "
        "and find no road; the cold creeps in where the day ends in the sky.",
    "床前明月光，疑是地上霜。老病犹忧病，衰羸不觉愁。":
        "Before my bed, the bright moonlight; I take it for frost upon the ground. Old and ill, I still fear "
        "illness; frail and thin, I do not feel my sorrow.",
    "床前明月光，疑是地上霜。玉女不相问，朱颜更可亲。":
        "Before my bed, the bright moonlight; I take it for frost upon the ground. The jade maiden does not "
        "ask after me; her rosy face is all the dearer.",
    "白日依山尽，黄河向水流。":
        "The white sun sinks behind the hills; the Yellow River flows toward the water.",
    "春眠不觉晓，春睡不知":
        "Asleep in spring, I miss the dawn; sleeping in spring, not knowing... (cut off: 4 new tokens)",
    "不知何处是长":
        "not knowing where is the long... (cut off: 6 tokens)",
    "不知。\n一别":
        "not knowing. / Once parted... (cut off: 6 tokens)",
    "不知何处人。":
        "not knowing where one is from.",
    "春风景色伤春绿，几处离亭杜若丝。 春风送客月明时，舞袖轻梳皎镜台。 无事闲眠耳夜深，残灯白玉一回":
        "The spring wind's scenery grieves at spring's green; at how many parting pavilions, threads of "
        "fragrant pollia. / The spring wind sees a guest off when the moon is bright; dancing sleeves comb "
        "lightly before the shining mirror stand. / Nothing to do, I sleep idly as the night grows deep; a "
        "guttering lamp, white jade, once... (cut off)",
    "春风送客去，江树送君归。江海多佳赏，江云不可期。\n南国有时逢，春风生":
        "The spring wind sees a guest off; the river trees send you home. Rivers and seas hold many fine "
        "sights; the river clouds cannot be counted on. / (the next poem) In the southern lands we meet at "
        "times; the spring wind rises... (cut off)",
    "春风吹柳柳，春色满池塘。\n春色春风起，春光满地开。\n":
        "The spring wind blows the willows, willows; spring colour fills the pond. / Spring colour, the spring "
        "wind rises; spring light opens over all the ground.",
    "春风吹柳拂，春日照花开。\n春风吹柳拂，春日照花开。\n":
        "The spring wind blows, the willows sway; the spring sun shines and the flowers open. / (the same line "
        "again)",
    "春风起，春草木兰蕙兰蕙。\n春草绿，春草萋萋萋萋萋，春":
        "The spring wind rises; spring grass, magnolia, orchid, melilot, orchid, melilot. / Spring grass green; "
        "spring grass lush, lush, lush, lush, lush; spring... (cut off; lines of 3 and 7 characters: the form is "
        "gone)",
}


def english(text: str) -> str:
    """The stored translation of ``text``, or :data:`NO_ENGLISH` when none is stored for exactly it."""
    return TRANSLATIONS.get(check_text(text), NO_ENGLISH)


def english_html(text: str) -> str:
    """The English line a widget shows under a poem: ``→`` and :func:`english`'s answer, HTML-escaped."""
    return f"<p style='color:#444;margin:4px 0;overflow-wrap:anywhere'>→ {html.escape(english(text))}</p>"


def glossed(chars) -> str:
    """``流 flow · 长 long · …``: each character of ``chars`` (a str, or an iterable of one-character
    strs) with its gloss, or alone where none is stored."""
    if isinstance(chars, str):
        chars = check_text(chars, "chars")
    elif isinstance(chars, bytes) or not hasattr(chars, "__iter__"):
        raise TypeError(f"chars must be a str or one-character strs, got {type(chars).__name__}")
    chars = list(chars)
    for ch in chars:
        if not isinstance(ch, str) or len(ch) != 1:
            raise TypeError(f"chars must be a str or one-character strs, got the item {ch!r}")
    return " · ".join(f"{ch} {GLOSSES[ch]}" if ch in GLOSSES else ch for ch in chars)
