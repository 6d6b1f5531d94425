;; text-length: a WASI preview 1 command (Soulbase WASM ABI, docs/wasm-abi.md).
;; Reads the call's arguments {"text": "..."} as JSON on stdin and writes
;; {"length": N} on stdout, N being the number of characters (Unicode scalar
;; values) of `text`. Escapes count as the one character they stand for.
(module
  (import "wasi_snapshot_preview1" "fd_read"
    (func $fd_read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write"
    (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $proc_exit (param i32)))
  (memory (export "memory") 2)
  ;; 0..16: iovec and counters; 64: the key pattern; 128: output prefix;
  ;; 1024..: output; 4096..131072: input.
  (data (i32.const 64) "\"text\":\"")
  (data (i32.const 128) "{\"length\":")

  (func $read_all (result i32)
    (local $total i32) (local $n i32)
    (block $done
      (loop $more
        (i32.store (i32.const 0) (i32.add (i32.const 4096) (local.get $total)))
        (i32.store (i32.const 4) (i32.sub (i32.const 126976) (local.get $total)))
        (if (call $fd_read (i32.const 0) (i32.const 0) (i32.const 1) (i32.const 8))
          (then (call $proc_exit (i32.const 2))))
        (local.set $n (i32.load (i32.const 8)))
        (br_if $done (i32.eqz (local.get $n)))
        (local.set $total (i32.add (local.get $total) (local.get $n)))
        (br_if $done (i32.ge_u (local.get $total) (i32.const 126976)))
        (br $more)))
    (local.get $total))

  ;; The offset just after `"text":"`, or exit 1 when absent.
  (func $find (param $len i32) (result i32)
    (local $i i32)
    (block $notfound
      (loop $scan
        (br_if $notfound (i32.gt_u (i32.add (local.get $i) (i32.const 8)) (local.get $len)))
        (if (i64.eq (i64.load (i32.add (i32.const 4096) (local.get $i))) (i64.load (i32.const 64)))
          (then (return (i32.add (local.get $i) (i32.const 8)))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $scan)))
    (call $proc_exit (i32.const 1))
    (unreachable))

  ;; Characters from `p` to the closing quote.
  (func $count (param $p i32) (param $len i32) (result i32)
    (local $c i32) (local $n i32)
    (block $end
      (loop $next
        (if (i32.ge_u (local.get $p) (local.get $len)) (then (call $proc_exit (i32.const 1))))
        (local.set $c (i32.load8_u (i32.add (i32.const 4096) (local.get $p))))
        (br_if $end (i32.eq (local.get $c) (i32.const 34)))
        (if (i32.eq (local.get $c) (i32.const 92))
          (then
            (local.set $n (i32.add (local.get $n) (i32.const 1)))
            (if (i32.eq (i32.load8_u (i32.add (i32.const 4097) (local.get $p))) (i32.const 117))
              (then (local.set $p (i32.add (local.get $p) (i32.const 6))))
              (else (local.set $p (i32.add (local.get $p) (i32.const 2)))))
            (br $next)))
        (if (i32.ne (i32.and (local.get $c) (i32.const 192)) (i32.const 128))
          (then (local.set $n (i32.add (local.get $n) (i32.const 1)))))
        (local.set $p (i32.add (local.get $p) (i32.const 1)))
        (br $next)))
    (local.get $n))

  ;; Writes {"length":N} to stdout.
  (func $emit (param $n i32)
    (local $digits i32) (local $d i32) (local $out i32)
    ;; digits, backwards, at 2047 downward
    (local.set $d (i32.const 2047))
    (loop $dig
      (i32.store8 (local.get $d) (i32.add (i32.const 48) (i32.rem_u (local.get $n) (i32.const 10))))
      (local.set $n (i32.div_u (local.get $n) (i32.const 10)))
      (local.set $digits (i32.add (local.get $digits) (i32.const 1)))
      (local.set $d (i32.sub (local.get $d) (i32.const 1)))
      (br_if $dig (i32.ne (local.get $n) (i32.const 0))))
    (memory.copy (i32.const 1024) (i32.const 128) (i32.const 10))
    (memory.copy (i32.const 1034) (i32.add (local.get $d) (i32.const 1)) (local.get $digits))
    (local.set $out (i32.add (i32.const 1034) (local.get $digits)))
    (i32.store8 (local.get $out) (i32.const 125))
    (i32.store (i32.const 0) (i32.const 1024))
    (i32.store (i32.const 4) (i32.sub (i32.add (local.get $out) (i32.const 1)) (i32.const 1024)))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8))))

  (func (export "_start")
    (local $len i32)
    (local.set $len (call $read_all))
    (call $emit (call $count (call $find (local.get $len)) (local.get $len)))))
