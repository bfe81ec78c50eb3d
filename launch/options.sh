# Sourced by the launchers: reads an option that takes a value, spelled --opt=value or --opt value.
#   option_value SCRIPT "$@"   sets OPT_VALUE to the value of the option in $1 and OPT_SHIFT to
#                              the arguments it used (1 or 2); exits 2 when the value is missing.
option_value() {
  local script="$1"; shift
  if [[ "$1" == *=* ]]; then
    OPT_VALUE="${1#*=}"; OPT_SHIFT=1
  elif (($# < 2)) || [[ "$2" == --* ]]; then
    echo "$script: $1 needs a value (see --help)" >&2; exit 2
  else
    OPT_VALUE="$2"; OPT_SHIFT=2
  fi
}
