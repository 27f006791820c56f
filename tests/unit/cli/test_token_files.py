"""One rule for every token file (the Proxy's ``--api-token-file`` / ``--admin-token-file``, the trainer's and
export's ``--admin-token-file``): the file holds the token alone, its surrounding whitespace stripped; an
empty file, one of more lines or one that cannot be read is a ConfigError naming the setting and the file."""

from __future__ import annotations

import pytest

from dressage.cli import main
from dressage.errors import ConfigError
from dressage.proxy.config import AccessConfig, admin_token_of


def _proxy_agent_token(path):
    return AccessConfig(api_token_file=path).api_token


def _proxy_admin_token(path):
    return AccessConfig(admin_token_file=path).admin_token


def _trainer_admin_token(path):
    return admin_token_of(path, "proxy.admin_token_file (--admin-token-file)")


READERS = [_proxy_agent_token, _proxy_admin_token, _trainer_admin_token]
SETTINGS = {_proxy_agent_token: "access.api_token_file", _proxy_admin_token: "access.admin_token_file",
            _trainer_admin_token: "proxy.admin_token_file (--admin-token-file)"}


@pytest.mark.parametrize("read", READERS)
@pytest.mark.parametrize("text", ["s3cret", "s3cret\n", "  s3cret \r\n\n", "\ts3cret\t"])
def test_a_token_file_gives_its_text_stripped(tmp_path, read, text):
    path = tmp_path / "token"
    path.write_bytes(text.encode())
    assert read(str(path)) == "s3cret"


@pytest.mark.parametrize("read", READERS)
@pytest.mark.parametrize("text, why", [("", "is empty"), ("\n", "is empty"), (" \r\n \n", "is empty"),
                                       ("first\nsecond\n", "holds more than one line"),
                                       ("first\r\nsecond", "holds more than one line"),
                                       (b"\xff\xfe", "not UTF-8 text")])
def test_an_empty_or_many_line_token_file_is_refused_naming_the_setting_and_the_file(tmp_path, read, text, why):
    path = tmp_path / "token"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError) as err:
        read(str(path))
    message = str(err.value)
    assert message.startswith(f"{SETTINGS[read]}: ") and repr(str(path)) in message and why in message


@pytest.mark.parametrize("read", READERS)
def test_a_missing_token_file_is_refused_naming_it(tmp_path, read):
    path = str(tmp_path / "nope")
    with pytest.raises(ConfigError, match=f"^{SETTINGS[read].replace('(', '[(]').replace(')', '[)]')}: "
                                          f"cannot read '{path}': No such file or directory$"):
        read(path)


def test_the_trainer_refuses_an_empty_admin_token_file_before_it_drains(tmp_path, capsys):
    empty = tmp_path / "admin.token"
    empty.write_text("\n")
    # The Proxy is never asked: nothing listens on port 9, and the file is refused first.
    assert main(["trainer", "--proxy-url", "http://127.0.0.1:9", "--admin-token-file", str(empty)]) == 2
    err = capsys.readouterr().err
    assert err == (f"dressage trainer: error: proxy.admin_token_file (--admin-token-file): {str(empty)!r} is empty; "
                   "it must hold the token\n")
