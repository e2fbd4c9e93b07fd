"""The control link's codec: frames, JSON and binary bodies, the start mark,
the agent's greeting and LINES frames, cut and damaged every way."""

from __future__ import annotations

import json
import os
from typing import List, Sequence

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from helpers import REPO
from linkhelpers import (JSON_KINDS, Frame, chunked, decode_frame, encode_frame, feed_all,
                         frames, fs_bytes, json_values)
from mslaunch.wire import link

# ---------------------------------------------------------------------------
# the codec: property tests
# ---------------------------------------------------------------------------

@settings(max_examples=200, deadline=None, database=None)
@given(st.lists(frames(), max_size=8), st.lists(st.integers(0, 4000), max_size=12))
def test_frames_survive_any_chunking(sent, cuts):
    data = b"".join(encode_frame(k, b) for k, b in sent)
    reader = link.Reader()
    got = feed_all(reader, chunked(data, cuts))
    assert not reader.buf
    assert [k for k, _ in got] == [k for k, _ in sent]
    for (kind, body), (gkind, gbody) in zip(sent, got):
        decoded = decode_frame(gkind, gbody)
        if kind in (link.OUTPUT, link.STDIN):
            assert decoded == body
        else:
            assert decoded == ({} if body is None else body)


@settings(max_examples=200, deadline=None, database=None)
@given(st.binary(max_size=3000), st.lists(frames(), min_size=1, max_size=4),
       st.lists(st.integers(0, 4000), max_size=10))
def test_junk_before_the_sync_mark_is_skipped_and_kept(junk, sent, cuts):
    # The junk must not itself hold the mark, nor end in a prefix that the mark completes.
    stream_head = junk + link.SYNC
    assume(stream_head.find(link.SYNC) == len(junk))
    frames_data = b"".join(encode_frame(k, b) for k, b in sent)
    reader = link.Reader(expect_sync=True)
    got = feed_all(reader, chunked(stream_head + frames_data, cuts))
    assert reader.synced
    assert reader.preamble == junk
    assert [decode_frame(k, b) for k, b in got] == [
        (b if k in (link.OUTPUT, link.STDIN) else (b or {})) for k, b in sent]


@settings(max_examples=200, deadline=None, database=None)
@given(st.lists(fs_bytes, max_size=6), st.dictionaries(fs_bytes.filter(lambda b: b"=" not in b),
                                                       fs_bytes, max_size=6))
def test_argv_and_environment_are_carried_byte_for_byte(argv, env):
    body = {"argv": [os.fsdecode(a) for a in argv],
            "env": {os.fsdecode(k): os.fsdecode(v) for k, v in env.items()}}
    (kind, raw), = link.Reader().feed(link.encode(link.JOB, body))
    assert raw.isascii()
    back = link.decode_json(kind, raw)
    assert [os.fsencode(a) for a in back["argv"]] == argv
    assert {os.fsencode(k): os.fsencode(v) for k, v in back["env"].items()} == env


def test_preamble_without_a_sync_mark_is_bounded():
    reader = link.Reader(expect_sync=True)
    assert reader.feed(b"x" * link.MAX_PREAMBLE) == []
    with pytest.raises(link.LinkError, match="start mark"):
        reader.feed(b"y" * (len(link.SYNC) + 1))


# ---------------------------------------------------------------------------
# the codec: fuzz
# ---------------------------------------------------------------------------

def _cut_and_check(reader: link.Reader, pieces: Sequence[bytes]) -> None:
    """Feed; every outcome is frames whose bodies decode or raise LinkError."""
    fed = 0
    for piece in pieces:
        fed += len(piece)
        try:
            got = reader.feed(piece)
        except link.LinkError:
            return
        assert len(reader.buf) <= fed      # nothing is buffered beyond what came in
        for kind, body in got:
            assert kind in link.NAMES
            try:
                value = decode_frame(kind, body)
            except link.LinkError:
                continue
            assert isinstance(value, (dict, tuple))


@settings(max_examples=300, deadline=None, database=None)
@given(st.binary(max_size=2000), st.lists(st.integers(0, 2000), max_size=8), st.booleans())
def test_random_bytes_give_frames_or_link_error(data, cuts, expect_sync):
    _cut_and_check(link.Reader(expect_sync=expect_sync), chunked(data, cuts))


@settings(max_examples=250, deadline=None, database=None)
@given(st.lists(frames(), min_size=1, max_size=5), st.lists(st.integers(0, 1 << 16), max_size=6),
       st.integers(0, 1 << 16), st.lists(st.integers(0, 4000), max_size=6), st.booleans())
def test_damaged_frames_give_frames_or_link_error(sent, flips, cut, cuts, with_sync):
    data = bytearray((link.SYNC if with_sync else b"")
                     + b"".join(encode_frame(k, b) for k, b in sent))
    for bit in flips:
        bit %= len(data) * 8
        data[bit // 8] ^= 1 << (bit % 8)
    data = bytes(data[:cut % (len(data) + 1)])
    _cut_and_check(link.Reader(expect_sync=with_sync), chunked(data, cuts))


@settings(max_examples=150, deadline=None, database=None)
@given(st.sampled_from(JSON_KINDS), st.one_of(
    st.binary(max_size=200),
    st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
    json_values.map(lambda v: json.dumps(v).encode("ascii")),
    st.integers(1, 3000).map(lambda n: b"[" * n + b"]" * n)))
def test_decode_json_returns_an_object_or_raises_link_error(kind, body):
    try:
        value = link.decode_json(kind, body)
    except link.LinkError:
        return
    assert isinstance(value, dict)


@pytest.mark.parametrize("body", [
    b"[" * 200_000, b'{"a":' * 100_000, b'{"n":' + b"9" * 10_000 + b"}", b"\xff\xfe",
    b'"\xc3\xa9"', b"NaN", b"null", b"", b"{}garbage", b"\x00"])
def test_decode_json_hostile_bodies(body):
    try:
        value = link.decode_json(link.JOB, body)
    except link.LinkError:
        return
    assert value == {} and body in (b"",)


@settings(max_examples=200, deadline=None, database=None)
@given(st.integers(link.MAX_FRAME + 1, (1 << 32) - 1), st.sampled_from(sorted(link.NAMES)),
       st.booleans())
def test_a_length_above_max_frame_is_refused_from_the_header_alone(length, kind, sync):
    reader = link.Reader(expect_sync=sync)
    with pytest.raises(link.LinkError, match="out of range"):
        reader.feed((link.SYNC if sync else b"") + link.HEAD.pack(length, kind))
    # ... while the largest allowed length waits for its body without a copy of it.
    reader = link.Reader()
    assert reader.feed(link.HEAD.pack(link.MAX_FRAME, kind) + b"{") == []
    assert len(reader.buf) == 6


def test_short_binary_frames_are_link_errors():
    for body in (b"", b"\0", b"\0\0\0\0"):
        with pytest.raises(link.LinkError):
            link.decode_binary(body)
    assert link.decode_binary(b"\0\0\0\1\2") == (1, 2, b"")


def read_in_place(reader: link.Reader, data: bytes, sizes: Sequence[int]) -> List[Frame]:
    """Feed ``data`` as a receiver does: into :meth:`Reader.room`, ``sizes`` bytes a
    time; bodies are copied at once, as views are only good until the next read.
    The last OUTPUT view is held on to, as a careless consumer might."""
    out: List[Frame] = []
    held = None
    pos, i = 0, 0
    while pos < len(data):
        want = max(1, sizes[i % len(sizes)] if sizes else 1 << 16)
        i += 1
        room = reader.room(want)
        n = min(len(room), want, len(data) - pos)
        room[:n] = data[pos:pos + n]
        del room
        pos += n
        for kind, body in reader.received(n):
            assert (type(body) is memoryview) == (kind == link.OUTPUT)
            if kind == link.OUTPUT:
                held = body
            out.append((kind, bytes(body)))
    del held
    return out


@settings(max_examples=200, deadline=None, database=None)
@given(st.lists(frames(), max_size=8), st.lists(st.integers(1, 3000), max_size=6),
       st.booleans(), st.binary(max_size=200))
def test_frames_read_in_place_are_the_frames_fed(sent, sizes, sync, junk):
    data = b"".join(encode_frame(k, b) for k, b in sent)
    if sync:
        data = junk.replace(link.SYNC, b"") + link.SYNC + data
    expected = link.Reader(expect_sync=sync).feed(data)
    reader = link.Reader(expect_sync=sync)
    assert read_in_place(reader, data, sizes) == expected
    assert not reader.buf


def test_a_frame_larger_than_the_buffer_grows_it_and_it_shrinks_after():
    big = link.encode(link.JOB, {"x": "y" * (link.KEEP + 100)})
    data = big + link.encode_output(1, 1, b"z" * 1000)
    reader = link.Reader()
    got = read_in_place(reader, data, [1 << 16])
    assert [k for k, _ in got] == [link.JOB, link.OUTPUT]
    assert got[0][1] == big[5:]
    assert len(reader._mem) <= link.KEEP


# ---------------------------------------------------------------------------
# the greeting
# ---------------------------------------------------------------------------

@settings(max_examples=100, deadline=None)
@given(st.sampled_from(JSON_KINDS), st.integers(0, 3), st.binary(max_size=4))
def test_an_agent_greeting_is_hello_of_this_protocol_and_keeps_what_follows(kind, protocol,
                                                                            tail):
    # ``tail``: the start of a frame header, not yet a frame
    first = link.encode(kind, {"protocol": protocol})
    after = link.encode(link.BEAT)
    reader = link.Reader(expect_sync=True)
    frames = reader.feed(link.SYNC + first + after + tail)
    if kind == link.HELLO and protocol == link.PROTOCOL:
        greeting, rest = link.hello(frames, reader)
        assert greeting["protocol"] == protocol and rest == after + tail
    else:
        with pytest.raises(link.LinkError, match="another protocol"):
            link.hello(frames, reader)


# ---------------------------------------------------------------------------
# LINES frames
# ---------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 255), st.binary(max_size=300),
       st.integers(0, 310))
def test_lines_frames_decode_to_what_was_sent_or_are_refused(rank, stream, data, whole):
    frame = link.lines_head(rank, stream, len(data), whole) + data
    (kind, body), = link.Reader().feed(frame)
    assert kind == link.LINES
    honest = whole <= len(data) and (whole == 0 or data[whole - 1:whole] == b"\n")
    if honest:
        assert link.decode_lines(body) == (rank, stream, whole, data)
    else:
        with pytest.raises(link.LinkError):
            link.decode_lines(body)


# -- the link's JSON, through the C accelerator without the json package -------------------

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70)
    | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner,
                                                                 max_size=5),
    max_leaves=30)


def test_the_agent_imports_none_of_the_costly_standard_modules():
    """Where the interpreter has ``_json`` (CPython), the link's codec drives it:
    an agent (``-S``, as it runs) imports neither ``json`` nor ``re``, nor
    ``socket``, ``enum`` or ``collections`` -- each milliseconds of every host's start."""
    from mslaunch.wire import wirejson
    assert wirejson._fast is not None
    code = ("import sys; from mslaunch.agent import agent; from mslaunch.wire import dialback, link; "
            "link.decode_json(1, link.encode(1, {'a': [1, 'x']})[5:]); "
            "print(sorted(m for m in ('json', 're', 'enum', 'socket', 'collections', "
            "'selectors', 'subprocess', 'hashlib', 'mslaunch.plan') if m in sys.modules))")
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": REPO},
                         check=True).stdout
    assert out.strip() == "[]", out


@given(_json_values)
def test_the_link_codec_writes_and_reads_as_the_json_package(value):
    import json

    from mslaunch.wire import wirejson
    text = wirejson.dumps(value)
    assert text == json.dumps(value, ensure_ascii=True, separators=(",", ":"))
    assert wirejson.loads(text) == json.loads(text)


@given(st.one_of(st.text(max_size=60), st.sampled_from([
    "", " ", "[1,", "{\"a\":}", "1 2", "[1] x", "NaN", "-Infinity", " {} ", "\ufeff{}",
    "[" * 3000 + "]" * 3000, "\"\\ud800\"", "01", "1.", "tru", "{\"a\" 1}"])))
def test_the_link_codec_refuses_what_the_json_package_refuses(text):
    import json

    from mslaunch.wire import wirejson
    try:
        expected = json.loads(text)
    except (ValueError, RecursionError):
        with pytest.raises((ValueError, RecursionError)):
            wirejson.loads(text)
        return
    got = wirejson.loads(text)
    assert got == expected or (got != got and expected != expected)   # NaN


def test_the_link_codec_refuses_what_cannot_be_json():
    from mslaunch.wire import wirejson
    with pytest.raises(TypeError):
        wirejson.dumps({"a": object()})
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValueError):
        wirejson.dumps(loop)


def test_the_link_codec_without_the_json_package_reads_and_refuses_as_the_package(tmp_path):
    """In an agent the json package is not loaded, and the accelerator then
    reports some errors without an exception of its own: every text must still
    give the package's value or a ValueError (checked against the package here)."""
    import json
    import random
    import subprocess
    import sys
    rng = random.Random(7)
    pieces = ['{', '}', '[', ']', ',', ':', '"', '\\', 'u', '1', '-', '.', 'e', 'a', ' ',
              'nope', 'true', 'null', 'NaN', '"k"', '\\u12', '\\ud800']
    texts = ['{nope', '[1,', '{"a":}', '{"a" 1}', '"abc', '{"a":1,}', '[' * 5000]
    texts += ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 12))) for _ in range(600)]
    (tmp_path / "texts").write_text(json.dumps(texts))
    code = ("import json as _j, sys; sys.modules.pop('json', None); "
            "sys.modules.pop('json.decoder', None); sys.modules.pop('json.scanner', None)\n"
            "from mslaunch.wire import wirejson\n"
            "out = []\n"
            f"texts = _j.loads(open({str(tmp_path / 'texts')!r}).read())\n"
            "assert 'json.decoder' not in sys.modules\n"
            "for t in texts:\n"
            "    try:\n"
            "        out.append(['ok', repr(wirejson.loads(t))])\n"
            "    except (ValueError, RecursionError):\n"
            "        out.append(['error', ''])\n"
            "print(_j.dumps(out))\n")
    r = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                       env={"PYTHONPATH": REPO})
    assert r.returncode == 0, r.stderr
    for text, (how, value) in zip(texts, json.loads(r.stdout)):
        try:
            expected = ["ok", repr(json.loads(text))]
        except (ValueError, RecursionError):
            expected = ["error", ""]
        assert [how, value] == expected, text


@given(st.sampled_from([link.STACKS, link.TOP]), st.integers(0, 1 << 40),
       st.floats(0.001, 60.0, allow_nan=False), st.booleans(),
       st.one_of(st.none(), st.integers(), st.text(max_size=5), st.lists(st.booleans())))
def test_a_look_is_read_back_as_sent_and_only_true_asks_for_main_threads(kind, ident, timeout,
                                                                         main, hostile):
    """A look's record survives its frame; ``main`` is a main-threads-only look only
    when it is JSON's true (anything else a launcher sends is a whole look)."""
    from mslaunch.wire import frames
    look = frames.Look(kind=kind, id=ident, timeout=timeout, main=main)
    [(got_kind, body)] = [(k, bytes(b)) for k, b in
                          feed_all(link.Reader(), [frames.encode(look)])]
    assert frames.from_launcher(got_kind, body) == look
    other = json.dumps({"id": ident, "timeout": timeout, "main": hostile}).encode()
    assert frames.from_launcher(kind, other).main is False


@given(st.integers(0, 1 << 31), st.sampled_from([1, 2]),
       st.dictionaries(st.sampled_from(["rank", "stream"]),
                       st.one_of(st.none(), st.integers(-3, 5), st.text(max_size=3),
                                 st.floats(allow_nan=False), st.booleans())))
def test_an_unwanted_stream_is_read_back_as_sent_and_anything_else_is_a_link_error(
        rank, stream, hostile):
    """``UNWANTED`` names one rank's stdout or stderr: read back as sent; a body
    without a rank from 0 and a stream of 1 or 2 is one LinkError."""
    from mslaunch.wire import frames
    told = frames.Unwanted(rank=rank, stream=stream)
    [(got_kind, body)] = [(k, bytes(b)) for k, b in
                          feed_all(link.Reader(), [frames.encode(told)])]
    assert frames.from_launcher(got_kind, body) == told
    good = (type(hostile.get("rank")) is int and hostile["rank"] >= 0
            and type(hostile.get("stream")) is int and hostile["stream"] in (1, 2))
    try:
        got = frames.from_launcher(link.UNWANTED, json.dumps(hostile).encode())
    except link.LinkError:
        assert not good
    else:
        assert good and got == frames.Unwanted(rank=hostile["rank"], stream=hostile["stream"])
