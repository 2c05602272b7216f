"""A small English->German parallel corpus generated deterministically (no download).

Sentences come from a grammar over ~150 words: subject, verb, object with adjectives, numbers,
prepositional phrases and subordinate clauses. The German side follows real German rules that a
model has to learn, not a word-for-word cipher: grammatical gender and case pick the article and
the adjective ending (der/den/dem, ein/einen/einem, -e/-en), nouns are capitalised, plural nouns
change form, and in a subordinate clause ("..., weil ...") the verb moves to the end.
BLEU on it is meaningful: a copy or a bag of words scores low, word order and agreement matter.
"""
import os
import random

# noun: (english singular, english plural, german singular, german plural, gender)
NOUNS = [
    ("dog", "dogs", "Hund", "Hunde", "m"), ("cat", "cats", "Katze", "Katzen", "f"),
    ("child", "children", "Kind", "Kinder", "n"), ("man", "men", "Mann", "Männer", "m"),
    ("woman", "women", "Frau", "Frauen", "f"), ("house", "houses", "Haus", "Häuser", "n"),
    ("car", "cars", "Auto", "Autos", "n"), ("book", "books", "Buch", "Bücher", "n"),
    ("teacher", "teachers", "Lehrer", "Lehrer", "m"), ("bird", "birds", "Vogel", "Vögel", "m"),
    ("city", "cities", "Stadt", "Städte", "f"), ("friend", "friends", "Freund", "Freunde", "m"),
    ("ball", "balls", "Ball", "Bälle", "m"), ("flower", "flowers", "Blume", "Blumen", "f"),
    ("table", "tables", "Tisch", "Tische", "m"), ("girl", "girls", "Mädchen", "Mädchen", "n"),
    ("boy", "boys", "Junge", "Jungen", "m"), ("letter", "letters", "Brief", "Briefe", "m"),
    ("apple", "apples", "Apfel", "Äpfel", "m"), ("door", "doors", "Tür", "Türen", "f"),
    ("horse", "horses", "Pferd", "Pferde", "n"), ("street", "streets", "Straße", "Straßen", "f"),
    ("garden", "gardens", "Garten", "Gärten", "m"), ("picture", "pictures", "Bild", "Bilder", "n"),
]
# adjective: (english, german stem)
ADJS = [("big", "groß"), ("small", "klein"), ("old", "alt"), ("young", "jung"), ("red", "rot"),
        ("green", "grün"), ("new", "neu"), ("beautiful", "schön"), ("fast", "schnell"), ("happy", "glücklich"),
        ("tired", "müde"), ("black", "schwarz"), ("white", "weiß"), ("quiet", "leise"), ("strong", "stark")]
# transitive verb: (english 3sg, english plural, german 3sg, german 3pl)
VERBS = [("sees", "see", "sieht", "sehen"), ("finds", "find", "findet", "finden"),
         ("buys", "buy", "kauft", "kaufen"), ("likes", "like", "mag", "mögen"),
         ("paints", "paint", "malt", "malen"), ("visits", "visit", "besucht", "besuchen"),
         ("carries", "carry", "trägt", "tragen"), ("needs", "need", "braucht", "brauchen"),
         ("hears", "hear", "hört", "hören"), ("follows", "follow", "folgt", "folgen"),
         ("knows", "know", "kennt", "kennen"), ("washes", "wash", "wäscht", "waschen")]
# preposition + dative: (english, german)
PREPS = [("in", "in"), ("with", "mit"), ("near", "bei"), ("behind", "hinter"), ("under", "unter")]
NUMBERS = [("two", "zwei"), ("three", "drei"), ("four", "vier"), ("five", "fünf"), ("many", "viele")]
CONJ = [("because", "weil"), ("while", "während"), ("although", "obwohl")]
ADVS = [("today", "heute"), ("often", "oft"), ("again", "wieder"), ("never", "nie"), ("slowly", "langsam")]

DEF = {"nom": {"m": "der", "f": "die", "n": "das", "pl": "die"},
       "acc": {"m": "den", "f": "die", "n": "das", "pl": "die"},
       "dat": {"m": "dem", "f": "der", "n": "dem", "pl": "den"}}
INDEF = {"nom": {"m": "ein", "f": "eine", "n": "ein"}, "acc": {"m": "einen", "f": "eine", "n": "ein"},
         "dat": {"m": "einem", "f": "einer", "n": "einem"}}


def _adj_ending(article: str, case: str, gender: str) -> str:
    """German adjective ending after a definite/indefinite article or a number (no article)."""
    if article == "none":  # strong declension (plural after a number)
        return {"nom": "e", "acc": "e", "dat": "en"}[case]
    if gender == "pl" or case == "dat":
        return "en"
    if article == "def":
        return "en" if (case == "acc" and gender == "m") else "e"
    # indefinite: the adjective shows the gender where the article does not
    if case == "acc" and gender == "m":
        return "en"
    return {"m": "er", "f": "e", "n": "es"}[gender]


def _inflect(stem: str, ending: str) -> str:
    return stem + (ending[1:] if stem.endswith("e") and ending.startswith("e") else ending)


def _noun_phrase(rng: random.Random, case: str):
    """(english words, german words, is_plural) for a random noun phrase in `case`."""
    en_sg, en_pl, de_sg, de_pl, gender = rng.choice(NOUNS)
    adj = rng.choice(ADJS) if rng.random() < 0.5 else None
    kind = rng.choices(["def", "indef", "num"], [0.5, 0.3, 0.2])[0]
    if kind == "num":
        num_en, num_de = rng.choice(NUMBERS)
        en = [num_en] + ([adj[0]] if adj else []) + [en_pl]
        de_noun = de_pl + ("n" if case == "dat" and not de_pl.endswith(("n", "s")) else "")
        num_de = "vielen" if (num_de == "viele" and case == "dat") else num_de
        de = [num_de] + ([_inflect(adj[1], _adj_ending("none", case, "pl"))] if adj else []) + [de_noun]
        return en, de, True
    if kind == "def":
        en, art = ["the"], DEF[case][gender]
    else:
        en, art = ["an" if (adj or (en_sg,))[0][0] in "aeiou" else "a"], INDEF[case][gender]
    en = en + ([adj[0]] if adj else []) + [en_sg]
    de = [art] + ([_inflect(adj[1], _adj_ending(kind, case, gender))] if adj else []) + [de_sg]
    return en, de, False


def _clause(rng: random.Random, subordinate: bool):
    s_en, s_de, s_pl = _noun_phrase(rng, "nom")
    o_en, o_de, _ = _noun_phrase(rng, "acc")
    v = rng.choice(VERBS)
    v_en, v_de = (v[1], v[3]) if s_pl else (v[0], v[2])
    en, de = s_en + [v_en] + o_en, None
    extra_en, extra_de = [], []
    if rng.random() < 0.4:
        p_en, p_de = rng.choice(PREPS)
        n_en, n_de, _ = _noun_phrase(rng, "dat")
        extra_en, extra_de = [p_en] + n_en, [p_de] + n_de
    adv = rng.choice(ADVS) if rng.random() < 0.3 else None
    en = en + extra_en + ([adv[0]] if adv else [])
    if subordinate:  # verb-final
        de = s_de + ([adv[1]] if adv else []) + o_de + extra_de + [v_de]
    else:
        de = s_de + [v_de] + ([adv[1]] if adv else []) + o_de + extra_de
    return en, de


def sentence_pair(rng: random.Random):
    en, de = _clause(rng, subordinate=False)
    if rng.random() < 0.35:
        c_en, c_de = rng.choice(CONJ)
        en2, de2 = _clause(rng, subordinate=True)
        en, de = en + [",", c_en] + en2, de + [",", c_de] + de2
    en[0] = en[0].capitalize()
    de[0] = de[0][0].upper() + de[0][1:]
    return " ".join(en).replace(" ,", ",") + " .", " ".join(de).replace(" ,", ",") + " ."


def write_corpus(out_dir: str, n_train: int = 20000, n_valid: int = 500, n_test: int = 500, seed: int = 1):
    """Writes {train,valid,test}.{en,de} into out_dir; the same seed gives the same files.
    Test and valid sentences never occur in train."""
    rng = random.Random(seed)
    seen, splits = set(), {"test": [], "valid": [], "train": []}
    for split, n in (("test", n_test), ("valid", n_valid), ("train", n_train)):
        while len(splits[split]) < n:
            pair = sentence_pair(rng)
            if pair[0] in seen:
                continue
            seen.add(pair[0])
            splits[split].append(pair)
    os.makedirs(out_dir, exist_ok=True)
    for split, pairs in splits.items():
        for i, lang in enumerate(("en", "de")):
            with open(os.path.join(out_dir, f"{split}.{lang}"), "w", encoding="utf-8") as f:
                f.writelines(p[i] + "\n" for p in pairs)
    return {k: len(v) for k, v in splits.items()}


if __name__ == "__main__":
    rng = random.Random(0)
    for _ in range(8):
        print(*sentence_pair(rng), sep="\n  ")
