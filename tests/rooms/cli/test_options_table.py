"""The mpirun dialect's option table and its parser agree (properties)."""

from __future__ import annotations

import contextlib
import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mslaunch.cli import main
from mslaunch.cli import mpirun
from mslaunch.cli.common import Exit
from mslaunch.cli.help import TEXT
from mslaunch.cli.options import SECTIONS, SPELLINGS, Option, lookup, nargs, words_of
from mslaunch.core.errors import UsageError

OPTIONS = [option for _, options in SECTIONS for option in options]
SPELLED = sorted(SPELLINGS)
DASHES = st.sampled_from(["-", "--"])
# a value that is never an option word, ':' or '--'
VALUE = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"),
                max_size=12).filter(lambda v: not v.startswith("-") and v != ":")


def parse(argv):
    return mpirun.parse_args(argv, environ={}, cwd="/nonexistent")


def test_every_spelling_belongs_to_one_option():
    assert sum(len(o.names) for o in OPTIONS) == len(SPELLINGS)
    for option in OPTIONS:
        assert option.kind in ("implemented", "accepted", "refused"), option
        assert (option.kind == "implemented") or option.note, option
        assert option.kind == "implemented" or option.apply is None, option
        assert 0 <= option.nargs <= 2, option
        for name in option.names:
            assert lookup(name) == (option.name, option.kind)
            assert nargs(name) == option.nargs


def test_every_help_entry_is_in_the_help_text():
    for option in OPTIONS:
        for line in option.help.replace("\t", "\n").split("\n"):
            assert line.strip() in TEXT, option


@settings(max_examples=300, deadline=None)
@given(spelling=st.sampled_from(SPELLED), dashes=DASHES, data=st.data())
def test_each_spelling_takes_its_number_of_values(spelling, dashes, data):
    # With apply replaced by a recorder, every spelling of the table reads
    # exactly its number of values, one dash or two, and the next word is
    # the program.
    option = SPELLINGS[spelling]
    seen = []
    recorder = Option(option.names, option.nargs,
                      lambda d, flag, values: seen.append((flag, list(values))))
    values = data.draw(st.lists(VALUE, min_size=option.nargs, max_size=option.nargs))
    flag = dashes + spelling
    with pytest.MonkeyPatch.context() as m:
        m.setitem(mpirun.SPELLINGS, spelling, recorder)
        job = parse([flag, *values, "prog", "-x"])
        assert seen == [(flag, values)]
        assert job.apps[0].argv == ("prog", "-x")
        if option.nargs == 1:
            seen.clear()
            parse([f"{flag}={values[0]}", "prog"])
            assert seen == [(flag, values)]
        else:
            with pytest.raises(UsageError, match=f"^{flag}=v: option takes {option.nargs} "):
                parse([f"{flag}=v", "prog"])


@settings(max_examples=200, deadline=None)
@given(spelling=st.sampled_from(SPELLED), dashes=DASHES)
def test_the_real_table_never_says_unknown(spelling, dashes):
    option = SPELLINGS[spelling]
    flag = dashes + spelling
    if option.nargs:
        with pytest.raises(UsageError) as err:
            parse([flag, *["1"] * (option.nargs - 1)])
        assert str(err.value) == f"{flag}: missing value"
    argv = ["-v", flag, *["1"] * option.nargs, "prog"]
    out = io.StringIO()
    try:
        with contextlib.redirect_stderr(out):
            parse(argv)
    except Exit:
        assert option.name in ("help", "version")
    except UsageError as err:
        assert "unknown option" not in str(err)
        assert option.kind != "accepted"
        if option.kind == "refused":
            assert str(err) == f"{flag}: not supported by mslaunch: {option.note}"
    else:
        assert option.kind != "refused"
        if option.kind == "accepted":
            assert f"mslaunch: note: {flag} has no effect here: {option.note}\n" in out.getvalue()


WORD = st.text("abcdefghijklmnopqrstuvwxyz-_0123456789XYZ", min_size=1, max_size=15)


@settings(max_examples=300, deadline=None)
@given(body=WORD, dashes=st.sampled_from(["-", "--", "---"]), tail=st.sampled_from(["", "=1"]))
def test_an_unknown_flag_is_one_line_naming_it(body, dashes, tail):
    token = dashes + body + tail
    word = words_of(token)[0]
    if word is None or word in SPELLINGS:
        return
    with pytest.raises(UsageError) as err:
        parse([token, "prog"])
    # (torchrun's options get their mslaunch spelling, a near miss a "did you mean")
    assert str(err.value).startswith(f"unknown option {token!r}")
    assert "\n" not in str(err.value) and "mslaunch" in str(err.value)
    out, errs = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(errs):
        # (-n first: a word of msrun's dialect first would switch to that dialect)
        status = main(["-n", "1", token, "prog"], run=lambda job: 0)
    assert status == 2 and out.getvalue() == ""
    assert errs.getvalue().count("\n") == 1
    assert errs.getvalue().startswith("mslaunch: error: unknown option ")
