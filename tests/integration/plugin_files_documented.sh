#!/usr/bin/env bash
# Every file of every in-tree plugin folder is named in docs/plugins.md's file-by-file list
# (issue 24: a reader trusts that list only while it is whole).
#   plugin_files_documented.sh SOURCE_DIR
set -u
root=${1:?source dir}
doc=$root/docs/plugins.md
missing=0
while IFS= read -r f; do
    rel=${f#"$root"/plugins/*/*/}
    case "$rel" in CMakeLists.txt|README.md|NOTES.md|*/CMakeLists.txt|*/NOTES.md) continue ;; esac
    if ! grep -qF "\`$rel\`" "$doc"; then
        echo "docs/plugins.md does not list ${f#"$root"/} (as \`$rel\`)"
        missing=1
    fi
done < <(find "$root"/plugins -mindepth 3 -type f ! -path '*/__pycache__/*' | sort)
[ $missing = 0 ] && echo "every plugin file is listed in docs/plugins.md"
exit $missing
