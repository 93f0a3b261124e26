"""Prompts for self-distillation that never meet the evaluation prompts.

Three sources, all offline: instructions about standard-library functions (data.function_prompts:
explain / write / continue), questions about the Python documentation topics shipped with the
interpreter (pydoc_data: the language reference's statements, operators and types), and everyday
chat questions from templates. Each source splits by subject (a function's file, a topic or a
documentation paragraph, a chat subject) with a fixed hash, so no prompt and no subject is in both
splits:
the "train" split feeds self-distillation, "heldout" the evaluation suites. HumanEval is never
a training prompt (data.prompt_sets screens the stdlib instructions against it).
"""
from __future__ import annotations

import itertools
from typing import Literal

from speculax.core import fields
from speculax.train import data

Split = Literal["train", "heldout"]
HELDOUT_FRACTION = 0.2

CHAT_SUBJECTS = (
    "making fresh pasta", "baking sourdough bread", "a week in Lisbon", "packing for a long flight",
    "growing tomatoes on a balcony", "pruning roses", "a budget trip to Japan",
    "cooking rice without a rice cooker", "keeping basil alive indoors", "a weekend in Rome",
    "making a vegetable soup", "composting kitchen scraps", "learning to swim as an adult",
    "training for a first 10k run", "writing a cover letter", "saving money on groceries",
    "choosing a first guitar", "keeping a houseplant alive", "planning a birthday party",
    "studying for an exam", "starting a vegetable garden", "camping in the rain",
    "brewing good coffee at home", "learning a new language", "painting a small room",
    "teaching a dog to sit", "making friends in a new city", "reading more books",
    "fixing a flat bicycle tire", "sleeping better", "baking chocolate chip cookies",
    "organizing a small kitchen", "taking better phone photos", "a road trip along a coast",
    "hosting a dinner for six", "starting to journal", "cleaning a cast iron pan",
    "visiting a museum with children", "making pancakes", "preparing for a job interview")
# More everyday subjects, none in CHAT_SUBJECTS and none restating a held-out one: training
# prompts only (DataConfig.everyday_chat), for drafters that serve chat (the mixture holds 168).
EVERYDAY_SUBJECTS = (
    "making homemade pizza dough", "roasting vegetables", "a first trip to Paris",
    "riding a bus across a new city", "repotting a cactus", "watering succulents",
    "a weekend hike in the mountains", "making a simple salad dressing",
    "cooking pasta sauce from scratch", "meal prepping for a busy week",
    "learning to ride a bicycle", "practicing yoga at home", "writing a thank-you note",
    "negotiating a salary", "choosing running shoes", "learning to play the piano",
    "decorating a small apartment", "preparing for a marathon", "making new year resolutions",
    "building a birdhouse", "going to the beach with a toddler", "making iced tea",
    "caring for a new kitten", "walking a dog in winter", "moving to a new apartment",
    "planning a picnic", "baking a banana bread", "making a smoothie", "reducing screen time",
    "learning to draw", "starting a book club", "organizing a closet", "decluttering a garage",
    "saving for a vacation", "writing a personal budget", "choosing a laptop for school",
    "taking notes in class", "giving a short speech", "waking up early", "drinking more water",
    "cooking eggs five ways", "making a grilled cheese sandwich", "grilling vegetables",
    "a day trip to the countryside", "visiting a national park", "a train journey through Europe",
    "planning a surprise party", "wrapping gifts neatly", "knitting a scarf", "sewing on a button",
    "ironing a shirt", "doing laundry without shrinking clothes", "removing a coffee stain",
    "keeping a car clean", "checking tire pressure", "jump-starting a car battery",
    "planting flower bulbs", "attracting birds to a garden", "raising backyard chickens",
    "keeping a fish tank clean", "bird watching", "stargazing on a clear night", "flying a kite",
    "building a snowman", "sledding safely", "making hot chocolate", "baking an apple pie",
    "making lemonade", "freezing fresh fruit", "storing bread so it stays fresh",
    "sharpening a kitchen knife", "setting a dinner table", "writing a poem about autumn",
    "keeping a gratitude list", "meditating for five minutes",
    "staying focused while working from home", "writing a polite complaint email",
    "planning a study schedule", "learning to type faster", "memorizing a speech",
    "sorting recycling at home", "making a family photo album",
    "celebrating a friend's birthday on a budget", "making paper airplanes",
    "playing chess as a beginner", "solving a jigsaw puzzle", "learning to juggle",
    "starting to run in the morning", "stretching after exercise", "carrying groceries on a bike",
    "packing a healthy school lunch", "making a cup of green tea", "hosting a board game night",
    "planning a wedding toast", "writing a letter to a pen pal", "visiting grandparents",
    "cleaning windows without streaks", "making a scarecrow", "carving a pumpkin",
    # Subjects 100-199 (DataConfig.everyday_chat counts them from the first):
    "making a fruit salad", "baking blueberry muffins", "cooking a quick stir fry",
    "making guacamole", "making overnight oats", "roasting a whole chicken",
    "making popcorn on the stove", "baking a birthday cake", "making granola at home",
    "cooking red lentils", "frosting cupcakes", "making strawberry jam", "baking salmon",
    "touring vineyards by bike", "visiting London on a budget", "a first cruise",
    "renting a car abroad", "a long layover at an airport", "traveling with a cat",
    "a ferry trip to an island", "a ski trip for beginners", "a city break in Vienna",
    "exploring a night market", "a cycling holiday", "a trip to the Grand Canyon",
    "traveling alone for the first time", "a summer week at a lake cabin",
    "fixing a leaky faucet", "hanging a picture frame", "assembling flat-pack furniture",
    "cleaning an oven", "unclogging a kitchen drain", "keeping a home cool in summer",
    "heating a home cheaply in winter", "getting rid of fruit flies", "washing a wool sweater",
    "folding a fitted sheet", "setting up a home office", "childproofing a living room",
    "putting up a wall shelf", "mowing a lawn", "growing strawberries in pots", "planting a tree",
    "keeping slugs off lettuce", "raking autumn leaves", "building a raised flower bed",
    "growing sunflowers", "caring for an orchid", "cycling to work", "starting strength training",
    "walking ten thousand steps a day", "cutting down on sugar", "cooking for one",
    "stretching at a desk", "packing a first aid kit", "learning to skateboard",
    "trying indoor rock climbing", "learning to dance salsa", "playing tennis for the first time",
    "learning to surf", "writing a resume", "asking for a day off", "running a team meeting",
    "preparing a slide presentation", "using a spreadsheet for the first time",
    "making a to-do list that works", "answering emails faster", "starting a small business",
    "selling old things online", "volunteering at a food bank", "applying to college",
    "making a science fair project", "learning the times tables",
    "helping a child with homework", "starting a podcast", "learning a simple magic trick",
    "building a model railway", "collecting stamps", "making a scrapbook", "writing a song",
    "playing the ukulele", "folding origami cranes", "hosting a movie night",
    "planning a family reunion", "throwing a costume party", "meeting new neighbors",
    "caring for a hamster", "adopting a rescue dog", "grooming a long-haired cat",
    "keeping bees", "saving energy at home", "buying a used car", "opening a bank account",
    "planning a yard sale", "giving old clothes a second life", "making a holiday card",
    "building a sandcastle", "going fishing at a lake", "watching a meteor shower",
    "making a paper lantern",
    # Subjects 200-299:
    "baking scones", "making hummus", "cooking a curry from scratch", "making homemade ice cream",
    "baking cornbread", "making dumplings", "grilling burgers", "making a cheese board",
    "cooking mushrooms", "making apple sauce", "pickling cucumbers", "making a fruit crumble",
    "cooking quinoa", "making a breakfast burrito", "roasting coffee beans", "making flatbread",
    "cooking a pot of chili", "making pesto", "baking a lemon tart", "a weekend in Barcelona",
    "visiting Berlin in winter", "a road trip through the desert", "a first visit to New York",
    "backpacking in Southeast Asia", "a hot air balloon ride", "a trip to see the northern lights",
    "a week on a Greek island", "a day at a theme park", "traveling by overnight train",
    "a trip to Iceland", "a long weekend in Amsterdam", "exploring a small fishing village",
    "visiting a zoo", "cleaning a bathroom quickly", "organizing a pantry",
    "changing a light bulb safely", "fixing a squeaky door", "clearing clutter off a desk",
    "descaling a kettle", "cleaning a microwave", "storing winter clothes", "hanging curtains",
    "patching a small hole in a wall", "keeping a fridge organized", "setting up a new phone",
    "backing up family files", "getting rid of a musty smell", "growing herbs on a windowsill",
    "growing potatoes in a bag", "planting a hedge", "caring for a lawn in summer",
    "growing peppers", "saving seeds from flowers", "making a small garden pond",
    "caring for a lemon tree", "planting a wildflower meadow", "watering a garden during a drought",
    "taking a daily walk", "doing push-ups correctly", "staying active in winter",
    "giving blood for the first time", "reducing stress at work", "keeping good posture",
    "warming up before a run", "building a home workout routine", "writing a short report",
    "giving feedback to a coworker", "asking good questions in class", "preparing for a math test",
    "writing an essay outline", "managing a group project", "starting a new job",
    "choosing a college major", "writing a lab report", "learning calligraphy",
    "starting a coin collection", "learning to whistle", "playing darts", "making candles",
    "pottery for beginners", "doing a crossword puzzle", "making a short film",
    "sketching with charcoal", "playing the harmonica", "learning to play golf",
    "growing a bonsai tree", "keeping a travel diary", "embroidery for beginners",
    "teaching a parrot to talk", "introducing a new cat to a dog", "apologizing to a friend",
    "planning a baby shower", "paying off a credit card", "saving for a first home",
    "comparing phone plans", "splitting a bill with friends", "decorating for the holidays",
    "preparing a home for a storm", "staying cool in a heat wave", "a spring cleaning day",
    # Subjects 300-399:
    "making spring rolls", "baking oatmeal cookies", "making a frittata",
    "cooking a steak in a pan", "making french toast", "baking a carrot cake",
    "making tacos for a crowd", "making falafel", "baking a quiche", "making chocolate truffles",
    "cooking a pot roast", "brewing loose leaf tea", "making mashed potatoes",
    "baking soft pretzels", "making a milkshake", "cooking shrimp", "making coleslaw",
    "a weekend in Prague", "visiting Kyoto in autumn", "a safari in Kenya",
    "a road trip across Canada", "a week in Mexico City", "a boat trip along a river",
    "visiting castles in Scotland", "a winter trip to Finland", "a first trip to Australia",
    "a weekend in Copenhagen", "a hiking trip in Patagonia", "a visit to Istanbul",
    "visiting the pyramids in Egypt", "cleaning grout between tiles", "defrosting a freezer",
    "replacing a shower head", "organizing cables behind a desk", "washing a down jacket",
    "getting wrinkles out without an iron", "cleaning a mattress", "keeping ants out of a kitchen",
    "insulating a drafty window", "choosing a vacuum cleaner", "cleaning a dishwasher filter",
    "setting up a home wifi network", "labeling moving boxes", "growing garlic",
    "growing carrots in containers", "growing blueberries", "building a trellis for beans",
    "growing microgreens", "keeping deer out of a garden", "growing pumpkins",
    "learning to jump rope", "doing a plank correctly", "hiking with a heavy backpack",
    "eating more vegetables", "taking the stairs more often", "cycling up steep hills",
    "starting pilates", "rowing on a machine", "writing a project proposal", "leading a workshop",
    "onboarding a new teammate", "working a night shift", "naming files so they are easy to find",
    "writing meeting notes", "studying with flashcards", "writing a book report",
    "learning basic first aid", "preparing for a driving test", "writing a scholarship application",
    "sewing a simple tote bag", "brewing kombucha", "making a terrarium",
    "painting with watercolors", "crocheting a hat", "learning to play the drums",
    "building a Lego city", "learning to sail", "archery for beginners",
    "playing the violin as an adult", "keeping a nature journal", "making soap at home",
    "restoring an old wooden chair", "learning a card game for two",
    "training a puppy to walk on a leash", "caring for a pet rabbit", "keeping a turtle",
    "taking a dog on a road trip", "welcoming a new baby sibling", "helping an elderly neighbor",
    "planning a graduation party", "keeping in touch with old friends",
    "hosting a tea party for kids", "filing taxes for the first time", "building an emergency fund",
    "shopping for a mattress", "choosing a health insurance plan", "signing a first rental lease",
    "packing a carry-on bag", "preparing a car for winter", "getting through a power outage")
CHAT_ASKS = ("Give me three tips for {}.", "What should a beginner know about {}?",
             "Write a short plan for {}.", "What are common mistakes in {}?",
             "Explain {} to a ten-year-old.", "Write a short story about {}.")
TOPIC_ASKS = ("Explain this part of Python with a short example: {}.",
              "What does a Python programmer need to know about this: {}?",
              "Explain this passage from the Python documentation in simple words:\n\n{}")


def split_of(subject: str, seed: int = 0) -> Split:
  """The split a subject belongs to, fixed by a hash (HELDOUT_FRACTION of subjects held out)."""
  return "heldout" if data.unit_hash(seed, subject) < HELDOUT_FRACTION else "train"


def chat_prompts(split: Split = "train", seed: int = 0, across: bool = False) -> list[str]:
  """Everyday questions: every ask of every subject in the split, subject by subject; across:
  the same prompts in rounds, round r asking subject i its ask (i + r) mod len(CHAT_ASKS), so the
  first n span min(n, subjects) subjects and every ask (a short suite then is not one subject)."""
  asked = _asked([s for s in CHAT_SUBJECTS if split_of(s, seed) == split])
  if not across:
    return asked
  n = len(CHAT_ASKS)  # asked holds subject i's ask a at i * n + a
  return [asked[i * n + (i + r) % n] for r in range(n) for i in range(len(asked) // n)]


def everyday_prompts(subjects: int = len(EVERYDAY_SUBJECTS)) -> list[str]:
  """Every ask of the first `subjects` EVERYDAY_SUBJECTS subjects (6 prompts each, all for
  training)."""
  fields.check("everyday_prompts subjects", subjects, int, ge=0, le=len(EVERYDAY_SUBJECTS))
  return _asked(EVERYDAY_SUBJECTS[:subjects])


def _asked(subjects) -> list[str]:
  """Every CHAT_ASKS ask of each subject, subject by subject."""
  return [ask.format(s) for s in subjects for ask in CHAT_ASKS]


def topic_prompts(split: Split = "train", seed: int = 0, max_chars: int = 1200) -> list[str]:
  """Questions about the documentation topics of this interpreter (pydoc_data): two about each
  distinct topic title, one per distinct paragraph of 200 to max_chars characters (each split
  by its own text: topics share titles and paragraphs)."""
  from pydoc_data.topics import topics
  titles, paragraphs = {}, {}  # insertion-ordered sets (topics share titles and paragraphs)
  for text in (text for _, text in sorted(topics.items())):
    title = text.strip().splitlines()[0].strip()
    if split_of(title, seed) == split:
      titles.setdefault(title, None)
    for para in (p.strip() for p in text.split("\n\n")):
      if 200 <= len(para) <= max_chars and split_of(para, seed) == split:
        paragraphs.setdefault(para, None)
  return ([ask.format(t) for t in titles for ask in TOPIC_ASKS[:2]]
          + [TOPIC_ASKS[2].format(p) for p in paragraphs])


def function_instructions(split: Split = "train", limit: int | None = None,
                          seed: int = 0) -> list[str]:
  """Instructions about stdlib functions from the split's files (training files: screened against
  HumanEval by data.prompt_sets)."""
  train_files, held_files = data.split_files(data.stdlib_files(), HELDOUT_FRACTION, seed=seed)
  if split == "train":
    return data.prompt_sets(train_files, limit=limit, seed=seed).train
  return [p for _, p in itertools.islice(data.function_prompts(held_files, seed=seed), limit)]


def mixture(split: Split = "train", per_source: int | None = None, seed: int = 0) -> list[str]:
  """The three sources interleaved (function, topic, chat, function, ...), each cut to
  per_source prompts (None: all); a source that runs out drops out of the rotation."""
  sources = [function_instructions(split, per_source, seed), topic_prompts(split, seed)[:per_source],
             chat_prompts(split, seed)[:per_source]]
  return [p for group in itertools.zip_longest(*sources) for p in group if p is not None]

