# Sourced by the scripts that run vlatune beside the reference or beside itself (step-overlap-gpu.sh,
# file-ab-gpu.sh): a named pair's recipe, data and reference flags, the same work on both sides.
#   pair_setup NAME DIR VLATUNE   sets pair_recipe (written into DIR), pair_data and pair_ref_flags (an array of
#                                 pi05_torch_reference.py flags); returns 2 for an unknown name, 1 when the data fails
#   fp8      recipes/pi05_libero_h200_fp8.json without prompt trimming, synthetic data; reference --fp8 tensorwise
#   bf16     the default recipe without prompt trimming, synthetic data; reference bf16
#   trimmed  recipes/pi05_libero_h200_fp8.json as shipped (trimming on) on a `vlatune data synth --prompt-len 20:64`
#            dataset (made by VLATUNE, log in DIR/trim_data.log); reference --fp8 tensorwise --text 64
pair_setup() {
  local name="$1" dir="$2" vlatune="$3"
  pair_data=synthetic
  pair_recipe="$dir/$name.json"
  pair_ref_flags=(--slots 2 --attn sdpa --recompute vit --compile layer)
  case "$name" in
    fp8)
      pair_write_recipe recipes/pi05_libero_h200_fp8.json "$pair_recipe" 0
      pair_ref_flags+=(--fp8 tensorwise) ;;
    bf16) pair_write_recipe none "$pair_recipe" 0 ;;
    trimmed)
      pair_write_recipe recipes/pi05_libero_h200_fp8.json "$pair_recipe" 1
      pair_ref_flags+=(--fp8 tensorwise --text 64)
      pair_data=/tmp/pair-trim-data
      rm -rf "$pair_data"
      "$vlatune" data synth --config full --samples 768 --prompt-len 20:64 --seed 0 --out "$pair_data" \
        >"$dir/trim_data.log" 2>&1 || { echo "trimmed data failed: $dir/trim_data.log" >&2; return 1; } ;;
    *) echo "unknown pair '$name' (fp8, bf16, trimmed)" >&2; return 2 ;;
  esac
}

# SRC (a recipe file, or none: the default recipe) -> DEST with data.trim_text set to TRIM (0 | 1).
pair_write_recipe() {
  python3 - "$@" <<'PY'
import json, sys
src, dest, trim = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
r = {"schema": "vlatune.recipe/1"} if src == "none" else json.load(open(src))
r.setdefault("data", {})["trim_text"] = trim
json.dump(r, open(dest, "w"), indent=2)
PY
}
