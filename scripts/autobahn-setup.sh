#!/usr/bin/env bash
# Installs Autobahn|Testsuite's `wstest` (the RFC 6455 conformance suite) into
# .cache/autobahn/ without touching the system, and does nothing once it is there.
#
# The suite is Python 2.7 code (autobahn 0.10.9 on Twisted 19.10) with no
# Python 3 port. Python 2.7.18 comes from Debian 11 (bullseye) packages,
# fetched with a private apt configuration from the Debian mirror this machine
# already uses and unpacked with `dpkg -x`; pip 20.3.4 (the last for 2.7) runs
# from its own wheel; the rest is a pinned PyPI set (autobahntestsuite's wheel
# declares no dependencies, so it is listed in full); wsaccel is built from its
# sdist against the unpacked 2.7 headers.
#
# Usage: scripts/autobahn-setup.sh [INSTALL_DIR]   (default: .cache/autobahn)
# AUTOBAHN_DEBIAN_MIRROR (and AUTOBAHN_DEBIAN_SECURITY_MIRROR) name another Debian mirror,
# e.g. http://archive.debian.org/debian once bullseye has left the ordinary mirrors.
# Leaves INSTALL_DIR/wstest. Exit status 3, with a line starting
# "autobahn unavailable:", means the Debian 11 packages could not be fetched
# (a retired release leaves the ordinary mirror for archive.debian.org);
# any other failure exits 1.
set -euo pipefail
export PIP_NO_PYTHON_VERSION_WARNING=1 PIP_DISABLE_PIP_VERSION_CHECK=1
cd "$(dirname "$0")/.."
D=$(realpath -m "${1:-.cache/autobahn}")
PINS_VERSION=1  # bump when the pinned set below changes: a cached install is rebuilt
mkdir -p "$D"
exec 9>"$D/.lock"
flock 9  # parallel test runs share one install
if [ -x "$D/wstest" ] && [ "$(cat "$D/.installed" 2>/dev/null)" = "$PINS_VERSION" ]; then
    exit 0
fi
echo "autobahn-setup: installing wstest into $D (once; about 30 s)" >&2
rm -rf "$D/build"
B=$D/build
R=$B/py27root
mkdir -p "$B"/apt/lists/partial "$B"/apt/cache/archives/partial "$B"/debs "$B"/wheels "$R"
: > "$B"/apt/status

unavailable() {
    echo "autobahn unavailable: $*" >&2
    exit 3
}

# The mirror this machine is configured with, asked for the bullseye suite.
SRCF=/etc/apt/sources.list.d/debian.sources
if [ -r "$SRCF" ]; then
    MAIN=$(awk '/^URIs:/ && !/security/ {print $2; exit}' "$SRCF")
    SEC=$(awk '/^URIs:/ && /security/ {print $2; exit}' "$SRCF")
fi
MAIN=${AUTOBAHN_DEBIAN_MIRROR:-${MAIN:-http://deb.debian.org/debian}}
SEC=${AUTOBAHN_DEBIAN_SECURITY_MIRROR:-${SEC:-http://deb.debian.org/debian-security}}
KEY=/usr/share/keyrings/debian-archive-keyring.gpg
command -v apt-get >/dev/null && command -v dpkg >/dev/null && [ -r "$KEY" ] \
    || unavailable "needs apt-get, dpkg and $KEY (a Debian machine) to fetch Debian 11's Python 2.7"
cat > "$B"/apt/sources.list <<SRC
deb [signed-by=$KEY] $MAIN bullseye main
deb [signed-by=$KEY] $SEC bullseye-security main
SRC
cat > "$B"/apt/apt.conf <<CONF
Dir::Etc::SourceList "$B/apt/sources.list";
Dir::Etc::SourceParts "/nonexistent";
Dir::State::Lists "$B/apt/lists";
Dir::State::status "$B/apt/status";
Dir::Cache "$B/apt/cache";
APT::Architecture "amd64";
CONF
export APT_CONFIG="$B/apt/apt.conf"
# apt-get update exits 0 when a suite is missing, so the download is what tells.
apt-get -q update >"$B"/apt-update.log 2>&1 || true
(cd "$B"/debs && apt-get -q download python2.7 python2.7-minimal libpython2.7-stdlib libpython2.7-minimal \
    libpython2.7 libpython2.7-dev python2.7-dev libssl1.1 libffi7 >"$B"/apt-download.log 2>&1) \
    || unavailable "Debian 11 (bullseye) Python 2.7 packages are not on $MAIN (moved to archive.debian.org?" \
                   "then set AUTOBAHN_DEBIAN_MIRROR=http://archive.debian.org/debian);" \
                   "see $B/apt-update.log and $B/apt-download.log"
unset APT_CONFIG
for f in "$B"/debs/*.deb; do dpkg -x "$f" "$R"; done

# The relocated interpreter needs its own libssl1.1 and libffi7: always run it through this wrapper.
cat > "$B"/py27 <<WRAP
#!/bin/sh
export PYTHONHOME=$D/py27root/usr
export LD_LIBRARY_PATH=$D/py27root/usr/lib/x86_64-linux-gnu\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
exec $D/py27root/usr/bin/python2.7 "\$@"
WRAP
cat > "$B"/wstest <<WRAP
#!/bin/sh
exec $D/py27 -m autobahntestsuite.wstest "\$@"
WRAP
chmod +x "$B"/py27 "$B"/wstest
# The wrappers name the final paths: move the interpreter there before using them.
rm -rf "$D"/py27root "$D"/py27 "$D"/wstest
mv "$R" "$D"/py27root
mv "$B"/py27 "$D"/py27

python3 -m pip download -q --no-deps -d "$B"/wheels pip==20.3.4 setuptools==44.1.1 wheel==0.37.1
"$D"/py27 "$B"/wheels/pip-20.3.4-py2.py3-none-any.whl/pip install -q --no-warn-script-location \
    --no-index --find-links "$B"/wheels pip==20.3.4 setuptools==44.1.1 wheel==0.37.1

cat > "$D"/requirements-py27.txt <<'REQ'
autobahntestsuite==25.10.1
autobahn[accelerate,twisted]==0.10.9
Twisted==19.10.0
txaio==2.1.0
zope.interface==4.6.0
incremental==16.10.1
pyOpenSSL==19.1.0
cryptography==3.3.2
service-identity==18.1.0
klein==17.10.0
Werkzeug==1.0.1
Jinja2==2.11.3
MarkupSafe==1.1.1
unittest2==1.1.0
six==1.16.0
setuptools==44.0.0
wsaccel==0.6.6
ujson==2.0.3
attrs==21.4.0
Automat==22.10.0
cffi==1.15.1
constantly==15.1.0
enum34==1.1.10
hyperlink==21.0.0
idna==2.10
ipaddress==1.0.23
linecache2==1.0.0
pyasn1==0.5.1
pyasn1-modules==0.3.0
pycparser==2.21
PyHamcrest==1.10.1
traceback2==1.4.0
typing==3.10.0.0
REQ
# wsaccel is compiled from its sdist (gcc and the headers from the -dev packages); nice: the cores are shared.
CFLAGS="-I$D/py27root/usr/include -I$D/py27root/usr/include/python2.7" nice -n 19 "$D"/py27 -m pip install -q \
    --no-warn-script-location -r "$D"/requirements-py27.txt
mv "$B"/wstest "$D"/wstest
"$D"/wstest --autobahnversion >/dev/null
rm -rf "$B"
echo "$PINS_VERSION" > "$D/.installed"
echo "autobahn-setup: ready: $D/wstest" >&2
