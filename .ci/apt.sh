# shellcheck shell=bash
# Sourced by .ci/install-deps and .ci/validate-deploy: installs Debian packages as root, or through
# sudo when not root, and says plainly what to do when neither is possible (the caller names the
# packages; nothing is installed that is already there).

# The command prefix that makes apt-get run as root: empty when root, `sudo` when sudo works
# (without a password, or with one on a terminal). Returns 1 when neither.
apt_prefix() {
  if [ "$(id -u)" = 0 ]; then
    echo ""
  elif command -v sudo >/dev/null && { sudo -n true 2>/dev/null || [ -t 0 ]; }; then
    echo "sudo"
  else
    return 1
  fi
}

apt_updated=false
# apt_install WHY PACKAGE...: installs the packages or exits 1 with what to do instead.
apt_install() {
  local why=$1; shift
  if ! command -v apt-get >/dev/null; then
    echo "error: $why needs the Debian/Ubuntu packages: $*" >&2
    echo "  there is no apt-get on this machine: install their equivalents with your package manager" >&2
    echo "  (PostgreSQL 15+ server binaries, OpenSSL headers, pkg-config, make, g++, python3 with venv, a JDK 17+, Maven)," >&2
    echo "  then run this script again" >&2
    exit 1
  fi
  local sudo
  if ! sudo=$(apt_prefix); then
    echo "error: $why needs the packages: $*" >&2
    echo "  cannot install them: not root, and sudo is missing or needs a password without a terminal" >&2
    echo "  fix: run as root, or with sudo: sudo apt-get install $*" >&2
    exit 1
  fi
  echo "installing ($why): $*"
  export DEBIAN_FRONTEND=noninteractive
  if ! $apt_updated; then
    $sudo apt-get update -qq
    apt_updated=true
  fi
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# True when `python3 -m venv` can make a venv with pip (Debian splits it out as python3-venv).
venv_works() {
  command -v python3 >/dev/null || return 1
  local probe
  probe=$(mktemp -d)
  if python3 -m venv "$probe/v" >/dev/null 2>&1 && [ -x "$probe/v/bin/pip" ]; then
    rm -rf "$probe"
    return 0
  fi
  rm -rf "$probe"
  return 1
}
