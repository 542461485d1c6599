"""Wordle's world: the word list, constants, the episode state, the JAX feedback rule and the
split classes of the secrets."""

from __future__ import annotations

import functools

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from rl4agents import text
from rl4agents.envs import base

SPLITS = base.SPLITS
WORD_LEN = 5
GREEN, YELLOW, GRAY = range(3)
MARKS = ("+", "?", "-")  # per color id
ALPHABET = "abcdefghijklmnopqrstuvwxyz"
WORDS = tuple(
    """
    about above abuse actor acute admit adopt adult after agent agree ahead alarm album alert
    alien alike alive allow alone along alter among anger angle angry ankle apart apple apply
    apron arena argue arise armor array arrow aside asset audio audit avoid award aware awful
    bacon badge badly baker basic basin basis batch beach beard beast begin being belly below
    bench berry birth black blade blame blank blast blaze bleak blend bless blind blink block
    bloom blown blunt blush board boast bonus boost booth bored bound brain brake brand brass
    brave bread break breed brick bride brief bring brisk broad broke brook broom brown brush
    buddy budge build built bunch burst buyer cabin cable camel canal candy canoe cargo carry
    carve catch cause cease chain chair chalk charm chart chase cheap cheat check cheek cheer
    chess chest chick chief child chill chose chunk cider cigar civic civil claim clash class
    clean clear clerk cliff climb cling cloak clock cloth cloud clown coach coast cocoa colon
    comic coral couch cough could count court cover crack craft crane crash crate crawl crazy
    cream creek crest crime crisp cross crowd crown crude cruel crumb crush crust cubic curve
    cycle daily dairy daisy dance dealt death debut decay delay dense depth diary dirty ditch
    dizzy dodge doing donor doubt dough dozen draft drain drama drank drawn dread dream dress
    dried drift drill drink drive drove drown dusty dwarf eager eagle early earth easel eaten
    ebony eight elbow elder elect elite empty enemy enjoy enter entry equal equip erase error
    essay event every exact exile exist extra fable faint fairy faith false fancy fatal fault
    feast fence ferry fetch fever fiber field fifth fifty fight final flame flash fleet flesh
    float flock flood flour fluid flush flute focus foggy force forge forth forty forum found
    frame fresh frost froze fruit fully funny fuzzy gauge ghost giant given glare glass gleam
    glide globe gloom glory glove goose grace grade grain grand grant grape graph grasp grass
    grave gravy great greed green greet grief grill grind groan group grove growl grown guard
    guest guide guilt habit happy hardy harsh hasty hatch haunt haven heart heavy hedge hello
    hence hinge hobby honey honor horse hotel hound house hover human humid humor hurry ideal
    image imply index inner input irony issue ivory jelly jewel joint joker jolly judge juice
    juicy jumbo knife knock known label labor large laser later laugh layer learn lease least
    leave ledge legal lemon level lever light limit linen liver lobby local lodge logic loose
    lover lower loyal lucky lunar lunch lying magic major maker mango manor maple march marsh
    match mayor meant medal media melon mercy merit merry metal meter might mimic minor minus
    mixer model moist money month moral motor mound mount mouse mouth movie muddy mural music
    naive nasty naval nerve never nifty night noble noise north notch novel nurse nylon oasis
    occur ocean offer often olive onion opera orbit order organ other otter ought ounce outer
    owner oxide paint panel panic paper party pasta paste patch pause peace peach pearl pedal
    penny perch phase phone photo piano piece pilot pinch pitch pixel pizza place plain plane
    plank plant plate plaza pluck plumb plump point polar porch pouch power press price pride
    prime print prior prism prize probe proof proud prove prune pulse punch pupil puppy purse
    queen query quest quick quiet quilt quite quota quote radar radio rainy raise rally ranch
    range rapid ratio raven reach ready realm rebel refer relax relay renew reply rider ridge
    rifle rigid rinse risky rival river roast robin robot rocky rough round route royal rugby
    ruler rumor rural rusty saint salad salon sandy sauce scale scarf scene scent scoop scope
    score scout scrap screw scrub seize sense serve seven shade shaft shake shall shame shape
    share shark sharp shave sheep sheet shelf shell shift shine shiny shirt shock shore short
    shout shown shrug sight silly since siren sixth sixty skate skill skirt skull slate sleep
    slept slice slide slope small smart smell smile smoke snack snake sneak sniff solar solid
    solve sorry sound south space spare spark speak spear speed spell spend spent spice spicy
    spike spill spine spoke spoon sport spray squad stack staff stage stain stair stake stale
    stamp stand start state steak steam steel steep steer stern stick stiff still sting stock
    stone stool store storm story stove straw strip stuck study stuff style sugar suite sunny
    super surge swamp swear sweat sweep sweet swell swift swing sword table taken taste teach
    teeth tempo thank theft their theme there these thick thief thing think third thorn those
    three threw throw thumb tiger tight timer tired title toast today token tooth topic torch
    total touch tough towel tower toxic track trade trail train trait trash treat trend trial
    tribe trick truck truly trunk trust truth tulip tumor twice twist ultra uncle under union
    unity until upper upset urban usage usual vague valve vapor vault venue verse video vigor
    villa vinyl viral virus visit vital vivid vocal voice voter wagon waist waste watch water
    weary weave wedge weigh weird whale wheat wheel where which while whine whirl white whole
    whose widow width witch woman world worry worse worst worth would woven wrath wreck wrist
    write wrong wrote yacht yeast yield young youth zebra
""".split()
)


WordleParams = base.SplitParams


@flax.struct.dataclass
class WordleState:
    """One episode: the secret and the guesses so far (M = max_guesses)."""

    secret: jax.Array  # int32[] word id of the secret
    guesses: jax.Array  # int32[M] word id guessed at each turn; -1 invalid turn or not yet
    turn: jax.Array  # int32[] turns taken
    greens: jax.Array  # bool[5] positions found green so far (a function of guesses, secret)
    done: jax.Array  # bool[] solved or out of turns


def letters(words: tuple[str, ...]) -> np.ndarray:
    """int32[W, 5] letter ids (a = 0) of each word."""
    return np.array([[ALPHABET.index(ch) for ch in w] for w in words], np.int32)


def feedback(guess: jax.Array, secret: jax.Array) -> jax.Array:
    """Per-letter colors of a guess, with the standard duplicate-letter rule.

    Args:
      guess: int32[5] letter ids of the guess.
      secret: int32[5] letter ids of the secret.

    Returns:
      int32[5] GREEN, YELLOW or GRAY per guess position: greens first, then each other guess
      letter, left to right, is yellow while the secret has an unmatched copy of it left.
    """
    green = guess == secret
    same = guess[:, None] == guess[None, :]  # [i, j]
    earlier = jnp.tril(jnp.ones((WORD_LEN, WORD_LEN), bool), -1)  # j < i
    rank = (same & earlier & ~green[None, :]).sum(axis=1)  # earlier unmatched copies in guess
    available = ((secret[None, :] == guess[:, None]) & ~green[None, :]).sum(axis=1)
    yellow = ~green & (rank < available)
    return jnp.where(green, GREEN, jnp.where(yellow, YELLOW, GRAY)).astype(jnp.int32)


def _frozen(x: np.ndarray) -> np.ndarray:
    """x made read-only (the cached tables are shared by every env)."""
    x.setflags(write=False)
    return x


@functools.cache
def heldout_mask(words: tuple[str, ...], threshold: int) -> np.ndarray:
    """bool[W] whether each word is a test-class secret (hash_u32(letters) % 1000 < threshold)."""
    hashes = jax.jit(jax.vmap(text.hash_u32))(jnp.asarray(letters(words)))
    return _frozen(np.asarray(hashes) % 1000 < threshold)
