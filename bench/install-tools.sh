# Sourced by the bench scripts: install_tools CMD:PACKAGE ... installs the Debian
# packages of the commands that are missing (as root with apt-get), or stops.
install_tools() {
    local need=() pair
    for pair in "$@"; do
        command -v "${pair%%:*}" >/dev/null 2>&1 || need+=("${pair#*:}")
    done
    [ ${#need[@]} -eq 0 ] && return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing ${need[*]}" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    else
        echo "missing ${need[*]}: install them (or run as root with apt-get)" >&2
        exit 1
    fi
}
