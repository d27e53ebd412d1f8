#!/usr/bin/env bash
# Checks that every relative markdown link `[text](target)` (and image `![alt](src)`) in
# README.md, ARCHITECTURE.md and docs/**/*.md resolves: the file or directory exists,
# relative to the markdown file, and a `#anchor` into a markdown file (or into the same
# file: `(#anchor)`) names a heading of it by its GitHub slug (lowercase, spaces to '-',
# punctuation other than '-' and '_' dropped, '-1', '-2', ... for repeated headings) or an
# explicit `<a id="...">`/`<a name="...">`.
#
# Skipped: http(s)://, mailto: and other scheme links, links inside fenced code blocks and
# inline code spans. Not handled: reference-style links (`[text][ref]`), setext headings
# (underlined with === or ---), targets containing ')'. Non-ASCII characters of a heading
# are kept in its slug as they are (GitHub drops the symbols among them; no heading here
# has any).
#
# Prints each broken link as `FILE: TARGET (why)` and exits 1 if there is any; prints
# `links: N checked, all resolve` otherwise. Usage: scripts/check-links.sh (from anywhere).
set -euo pipefail
cd "$(dirname "$0")/.."

files=()
for f in README.md ARCHITECTURE.md; do
  [ -f "$f" ] && files+=("$f")
done
while IFS= read -r -d '' f; do
  files+=("$f")
done < <(find docs -type f -name '*.md' -print0 | sort -z)

if [ "${#files[@]}" -eq 0 ]; then
  echo "check-links: no markdown files found" >&2
  exit 1
fi

# POSIX awk (mawk or gawk): no gawk extensions.
awk '
function dirname(p,    i) {
  i = match(p, /\/[^\/]*$/)
  return i ? substr(p, 1, i - 1) : "."
}

# Removes "." and "dir/.." components; keeps leading ".." (outside the repository).
function normalize(p,    n, parts, out, k, i, seg) {
  n = split(p, parts, "/")
  k = 0
  for (i = 1; i <= n; i++) {
    seg = parts[i]
    if (seg == "" || seg == ".") continue
    if (seg == ".." && k > 0 && out[k] != "..") { k--; continue }
    out[++k] = seg
  }
  p = ""
  for (i = 1; i <= k; i++) p = p (i > 1 ? "/" : "") out[i]
  return p == "" ? "." : p
}

function exists(p) {
  if (p in exist_cache) return exist_cache[p]
  # (A path with a quote is not looked up: no file here has one.)
  exist_cache[p] = (p !~ /\047/ && system("test -e \047" p "\047") == 0)
  return exist_cache[p]
}

function closes(line, fence) {
  sub(/^ */, "", line)
  return substr(line, 1, 3) == fence
}

function is_fence(line) {
  return line ~ /^ ? ? ?(```|~~~)/
}

# The GitHub slug of a heading text.
function slug(text,    out, i, c, ascii) {
  # A link in a heading counts by its text.
  while (match(text, /\[[^]]*\]\([^)]*\)/)) {
    out = substr(text, RSTART, RLENGTH)
    sub(/\]\(.*$/, "", out)
    sub(/^\[/, "", out)
    text = substr(text, 1, RSTART - 1) out substr(text, RSTART + RLENGTH)
  }
  text = tolower(text)
  out = ""
  for (i = 1; i <= length(text); i++) {
    c = substr(text, i, 1)
    if (c ~ /[a-z0-9_-]/) out = out c
    else if (c == " ") out = out "-"
    else if (!index(PRINTABLE, c)) out = out c   # a byte of a non-ASCII character
  }
  return out
}

# Reads the anchors of markdown file p into anchors[p, slug] (once).
function load_anchors(p,    line, fence, h, s, n, rest, id) {
  if (p in loaded) return
  loaded[p] = 1
  fence = ""
  while ((getline line < p) > 0) {
    if (fence != "") {
      if (closes(line, fence)) fence = ""
      continue
    }
    if (is_fence(line)) {
      sub(/^ */, "", line)
      fence = substr(line, 1, 3)
      continue
    }
    if (line ~ /^ ? ? ?#+( |$)/) {
      h = line
      sub(/^ *#+ */, "", h)
      sub(/ +#+ *$/, "", h)
      sub(/ +$/, "", h)
      s = slug(h)
      n = seen[p, s]++
      anchors[p, (n ? s "-" n : s)] = 1
    }
    rest = line
    while (match(rest, /<a [^>]*(id|name)="[^"]*"/)) {
      id = substr(rest, RSTART, RLENGTH)
      sub(/^.*(id|name)="/, "", id)
      sub(/"$/, "", id)
      anchors[p, id] = 1
      rest = substr(rest, RSTART + RLENGTH)
    }
  }
  close(p)
}

function broken(file, target, why) {
  printf "%s: %s (%s)\n", file, target, why
  nbroken++
}

function check(file, target,    t, path, anchor, i) {
  t = target
  sub(/^</, "", t); sub(/>$/, "", t)
  if (t ~ /^[A-Za-z][A-Za-z0-9+.-]*:/) return   # http:, https:, mailto:, ...
  nchecked++
  anchor = ""
  i = index(t, "#")
  if (i) { anchor = substr(t, i + 1); t = substr(t, 1, i - 1) }
  gsub(/%20/, " ", t)
  if (t == "") path = file
  else if (substr(t, 1, 1) == "/") path = normalize(substr(t, 2))
  else path = normalize(dirname(file) "/" t)
  if (!exists(path)) { broken(file, target, "no such file or directory: " path); return }
  if (anchor == "" || path !~ /\.(md|markdown)$/) return
  load_anchors(path)
  if (!((path, tolower(anchor)) in anchors) && !((path, anchor) in anchors))
    broken(file, target, "no heading with the anchor #" anchor " in " path)
}

BEGIN {
  for (i = 32; i < 127; i++) PRINTABLE = PRINTABLE sprintf("%c", i)
}

FNR == 1 { fence = "" }
{
  line = $0
  if (fence != "") {
    if (closes(line, fence)) fence = ""
    next
  }
  if (is_fence(line)) {
    sub(/^ */, "", line)
    fence = substr(line, 1, 3)
    next
  }
  # Inline code spans are not links; a span inside a link text leaves the link.
  gsub(/`[^`]*`/, "C", line)
  while (match(line, /\[[^]]*\]\([^)]*\)/)) {
    m = substr(line, RSTART, RLENGTH)
    line = substr(line, RSTART + RLENGTH)
    sub(/^\[[^]]*\]\(/, "", m)
    sub(/\)$/, "", m)
    sub(/^ +/, "", m)
    sub(/ +"[^"]*" *$/, "", m)   # an optional title
    sub(/ +$/, "", m)
    if (m == "") { nchecked++; broken(FILENAME, "()", "empty link"); continue }
    check(FILENAME, m)
  }
}

END {
  if (nbroken > 0) exit 1
  printf "links: %d checked, all resolve\n", nchecked
}
' "${files[@]}"
