use super::*;
use std::io::Cursor;

fn read(
    text: &str,
    format: Option<Format>,
    on_error: OnError,
) -> (Vec<Result<Record, TraceError>>, u64) {
    let input: Box<dyn BufRead + Send> = Box::new(Cursor::new(text.as_bytes().to_vec()));
    let mut r = Reader::from_input(input, "t".into(), format, Select::default(), on_error).unwrap();
    let out: Vec<_> = r.by_ref().collect();
    (out, r.skipped())
}

fn records(text: &str, format: Format) -> Vec<Record> {
    let (out, skipped) = read(text, Some(format), OnError::Stop);
    assert_eq!(skipped, 0);
    out.into_iter().map(|r| r.unwrap()).collect()
}

fn rec(time: Nanos, op: Op, offset: u64, len: u32, volume: u64) -> Record {
    Record {
        time,
        op,
        offset,
        len,
        volume,
    }
}

#[test]
fn each_format_reads_its_fields_in_its_units() {
    let msr = "128166372003061629,src1,0,Read,3154149376,4096,5834\n128166372003071629,src1,1,Write,0,512,100\n";
    assert_eq!(
        records(msr, Format::Msr),
        [
            rec(0, Op::Read, 3154149376, 4096, 0),
            rec(1_000_000, Op::Write, 0, 512, 1)
        ]
    );
    let umass = "0,20941264,8192,W,0.551706\n1,3436288,15872,r,0.554041,extra\n";
    assert_eq!(
        records(umass, Format::Umass),
        [
            rec(0, Op::Write, 20941264 * 512, 8192, 0),
            rec(2_335_000, Op::Read, 3436288 * 512, 15872, 1)
        ]
    );
    let ali = "device_id,opcode,offset,length,timestamp\n419,W,8792731648,16384,1577808000000043\n419,R,4096,4096,1577808000000143\n";
    assert_eq!(
        records(ali, Format::Alibaba),
        [
            rec(0, Op::Write, 8792731648, 16384, 419),
            rec(100_000, Op::Read, 4096, 4096, 419)
        ]
    );
    let tencent = "1538323200,12881024,8,1,1283\n1538323202,16,16,0,7\n";
    assert_eq!(
        records(tencent, Format::Tencent),
        [
            rec(0, Op::Write, 12881024 * 512, 4096, 1283),
            rec(2_000_000_000, Op::Read, 8192, 8192, 7)
        ]
    );
    let blk = "  8,0    3        1     0.000000000   697  Q   W 223490 + 8 [kjournald]\n  8,0    3        2     0.000001000   697  G   W 223490 + 8 [kjournald]\n  8,16   0        3     0.250000000     0  Q  RA 100 + 16 [cat]\n  8,0    1        4     0.300000000     0  Q FWS [jbd2]\n  8,0    1        5     0.400000000     0  Q   D 0 + 2048 [fstrim]\nCPU0 (8,0):\n Reads Queued:           0,        0KiB\n";
    assert_eq!(
        records(blk, Format::Blkparse),
        [
            rec(0, Op::Write, 223490 * 512, 4096, 8 << 20),
            rec(250_000_000, Op::Read, 51200, 8192, (8 << 20) | 16),
            rec(300_000_000, Op::Flush, 0, 0, 8 << 20),
            rec(400_000_000, Op::Trim, 0, 1 << 20, 8 << 20),
        ]
    );
    let v3 = "fio version 3 iolog\n0 a add\n0 a open\n10 a write 0 4096\n25 b read 8192 512\n30 a datasync 0 0\n40 a close\n";
    assert_eq!(
        records(v3, Format::FioV3),
        [
            rec(0, Op::Write, 0, 4096, 0),
            rec(15_000, Op::Read, 8192, 512, 1),
            rec(20_000, Op::Flush, 0, 0, 0)
        ]
    );
    let v2 = "fio version 2 iolog\n/dev/x add\n/dev/x open\n/dev/x write 0 4096\n/dev/x wait 1500 0\n/dev/x trim 4096 4096\n/dev/x close\n";
    assert_eq!(
        records(v2, Format::FioV2),
        [
            rec(0, Op::Write, 0, 4096, 0),
            rec(1_500_000, Op::Trim, 4096, 4096, 0)
        ]
    );
}

#[test]
fn the_format_is_recognised_from_the_first_line() {
    for (line, f) in [
        (
            "128166372003061629,src1,0,Read,3154149376,4096,5834",
            Format::Msr,
        ),
        ("0,20941264,8192,W,0.551706", Format::Umass),
        ("419,W,8792731648,16384,1577808000000043", Format::Alibaba),
        ("1538323200,12881024,8,1,1283", Format::Tencent),
        (
            "  8,0    3        1     0.000000000   697  Q   W 223490 + 8 [kjournald]",
            Format::Blkparse,
        ),
        ("fio version 3 iolog", Format::FioV3),
        ("fio version 2 iolog", Format::FioV2),
    ] {
        assert_eq!(formats::detect(line), Some(f), "{line}");
    }
    assert_eq!(formats::detect("hello,world"), None);
    let input: Box<dyn BufRead + Send> = Box::new(Cursor::new(b"what is this\n".to_vec()));
    let e = Reader::from_input(
        input,
        "x.csv".into(),
        None,
        Select::default(),
        OnError::Stop,
    )
    .err()
    .unwrap();
    assert!(
        e.to_string().starts_with("x.csv: cannot tell its format"),
        "{e}"
    );
    // Binary data is said to be binary, not printed back.
    let garbage: Vec<u8> = (0..=255u8).cycle().take(3000).collect();
    let input: Box<dyn BufRead + Send> = Box::new(Cursor::new(garbage));
    let e = Reader::from_input(
        input,
        "g.bin".into(),
        None,
        Select::default(),
        OnError::Stop,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.starts_with("g.bin: not a text trace: its first line holds binary data"),
        "{e}"
    );
    assert!(e.is_ascii(), "{e}");
}

#[test]
fn bad_lines_name_file_and_line_and_are_skipped_or_stop() {
    let text = "1,h,0,Read,0,4096,1\n2,h,0,Erase,0,4096,1\n3,h,0,Read,x,4096,1\n4,h,0,Read\n5,h,0,Write,0,0,1\n6,h,0,Read,4096,4096,1\n";
    let (out, skipped) = read(text, Some(Format::Msr), OnError::Skip);
    assert_eq!(skipped, 4);
    assert_eq!(out.len(), 2);
    assert!(out.iter().all(|r| r.is_ok()));
    let (out, _) = read(text, Some(Format::Msr), OnError::Stop);
    assert_eq!(out.len(), 2, "one record, then the error, then nothing");
    let e = out[1].clone().unwrap_err();
    assert_eq!((e.file.as_str(), e.line), ("t", 2));
    assert_eq!(e.to_string(), "t:2: type 'Erase': expected Read or Write");
    for (line, problem) in [
        ("3,h,0,Read,x,4096,1", "offset 'x' is not a whole number"),
        ("4,h,0,Read", "only 4 of the 7 fields"),
        ("5,h,0,Write,0,0,1", "length 0"),
        ("5,h,0,Write,0,67108864,1", "above the 32 MiB"),
        ("5,h,0,Write,18446744073709551615,4096,1", "overflows"),
        (
            "184467440737095517,h,0,Write,0,4096,1",
            "timestamp overflows",
        ),
    ] {
        let (out, _) = read(line, Some(Format::Msr), OnError::Stop);
        let e = out[0].clone().unwrap_err();
        assert!(e.problem.contains(problem), "{line}: {e}");
    }
}

/// A line without end is passed over, not kept: memory stays at the line limit
/// whatever the line's length, the error names its line, and the lines after it are
/// read (with `Skip`).
#[test]
fn a_line_without_end_is_an_error_not_a_buffer() {
    /// 64 MiB of one line, then two good records.
    struct Endless(u64);
    impl std::io::Read for Endless {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            const LONG: u64 = 64 << 20;
            const TAIL: &[u8] = b"\n2,h,0,Read,0,4096,1\n3,h,0,Read,4096,4096,1\n";
            let n = if self.0 < LONG {
                let n = out.len().min((LONG - self.0) as usize);
                out[..n].fill(b'7');
                n
            } else {
                let at = (self.0 - LONG) as usize;
                let rest = &TAIL[at.min(TAIL.len())..];
                let n = out.len().min(rest.len());
                out[..n].copy_from_slice(&rest[..n]);
                n
            };
            self.0 += n as u64;
            Ok(n)
        }
    }
    let input: Box<dyn BufRead + Send> = Box::new(std::io::BufReader::new(Endless(0)));
    let mut r = Reader::from_input(
        input,
        "t".into(),
        Some(Format::Msr),
        Select::default(),
        OnError::Skip,
    )
    .unwrap();
    let got: Vec<Record> = r.by_ref().map(|x| x.unwrap()).collect();
    assert_eq!(got.len(), 2);
    assert_eq!(r.skipped(), 1);
    let e = &r.errors()[0];
    assert_eq!(e.line, 1);
    assert!(e.problem.contains("longer than 1024 KiB"), "{e}");
    assert!(r.buf.capacity() <= 2 * MAX_LINE, "{}", r.buf.capacity());
    // The limit itself: a line of exactly the limit is whole, one byte more is not.
    let mut buf = Vec::new();
    let mut input = Cursor::new(b"abcd\nabcde\nab".to_vec());
    assert_eq!(read_line(&mut input, &mut buf, 5).unwrap(), Line::Whole);
    assert_eq!(buf, b"abcd\n");
    buf.clear();
    assert_eq!(read_line(&mut input, &mut buf, 5).unwrap(), Line::TooLong);
    assert_eq!(buf, b"abcde");
    buf.clear();
    assert_eq!(read_line(&mut input, &mut buf, 5).unwrap(), Line::Whole);
    assert_eq!(buf, b"ab");
    buf.clear();
    assert_eq!(read_line(&mut input, &mut buf, 5).unwrap(), Line::End);
}

#[test]
fn select_takes_a_volume_and_a_time_slice() {
    let text =
        "0,0,4096,R,0.0\n1,8,4096,R,0.5\n0,16,4096,W,1.0\n0,24,4096,W,1.5\n0,32,4096,R,2.0\n";
    let input: Box<dyn BufRead + Send> = Box::new(Cursor::new(text.as_bytes().to_vec()));
    let select = Select {
        volume: Some(0),
        from: Some(500_000_000),
        to: Some(2_000_000_000),
        event: None,
    };
    let got: Vec<Record> = Reader::from_input(
        input,
        "t".into(),
        Some(Format::Umass),
        select,
        OnError::Stop,
    )
    .unwrap()
    .map(|r| r.unwrap())
    .collect();
    assert_eq!(
        got,
        [
            rec(1_000_000_000, Op::Write, 8192, 4096, 0),
            rec(1_500_000_000, Op::Write, 12288, 4096, 0)
        ]
    );
}

#[test]
fn gzip_and_zstd_input_read_as_the_plain_text() {
    use std::io::Write as _;
    let text = "128166372003061629,src1,0,Read,3154149376,4096,5834\n".repeat(1000);
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("t.csv");
    std::fs::write(&plain, &text).unwrap();
    let gz = dir.path().join("t.csv.gz");
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(text.as_bytes()).unwrap();
    std::fs::write(&gz, e.finish().unwrap()).unwrap();
    let zst = dir.path().join("t.csv.zst");
    let z = ruzstd::encoding::compress_to_vec(
        text.as_bytes(),
        ruzstd::encoding::CompressionLevel::Fastest,
    );
    std::fs::write(&zst, z).unwrap();
    let want = read_all(&plain, Some(Format::Msr)).unwrap();
    assert_eq!(want.len(), 1000);
    assert_eq!(read_all(&gz, None).unwrap(), want);
    assert_eq!(read_all(&zst, None).unwrap(), want);
    let e = read_all(&dir.path().join("missing"), None).unwrap_err();
    assert!(e.to_string().contains("cannot open it"), "{e}");
}

#[test]
fn stats_are_exact_on_a_trace_of_known_shape() {
    let mut c = stats::Collector::new();
    // 100 sequential 4 KiB reads then 50 random-ish 8 KiB writes over 10 s, one a 0.1 s...
    for i in 0..100u64 {
        c.add(&rec(i * 50_000_000, Op::Read, i * 4096, 4096, 0));
    }
    for i in 0..50u64 {
        c.add(&rec(
            5_000_000_000 + i * 100_000_000,
            Op::Write,
            (i % 10) * 1_048_576,
            8192,
            0,
        ));
    }
    c.add(&rec(9_950_000_000, Op::Flush, 0, 0, 0));
    let s = c.finish();
    assert_eq!(s.requests, 151);
    assert_eq!((s.reads.requests, s.reads.bytes), (100, 409_600));
    assert_eq!((s.writes.requests, s.writes.bytes), (50, 409_600));
    assert_eq!(s.flushes, 1);
    assert!((s.read_fraction - 100.0 / 150.0).abs() < 1e-12);
    assert_eq!(s.read_byte_fraction, 0.5);
    assert_eq!(s.span_s, 9.95);
    assert_eq!(s.sizes, [(4096, 100), (8192, 50)]);
    // 99 sequential reads (each after the previous); no write follows its predecessor's end.
    assert!((s.sequential_fraction - 99.0 / 150.0).abs() < 1e-12);
    // 100 read blocks + 10 distinct 2-block write ranges (block 0-1 of the writes overlaps reads' 0-1, 256-257...).
    let read_blocks: std::collections::HashSet<u64> = (0..100).collect();
    let mut all = read_blocks.clone();
    let mut twice = std::collections::HashSet::new();
    let mut seen = read_blocks;
    for i in 0..50u64 {
        for b in [(i % 10) * 256, (i % 10) * 256 + 1] {
            all.insert(b);
            if !seen.insert(b) {
                twice.insert(b);
            }
        }
    }
    assert_eq!(s.footprint_bytes, all.len() as u64 * 4096);
    assert_eq!(s.reused_bytes, twice.len() as u64 * 4096);
    assert_eq!(s.per_bin.iter().sum::<u64>(), 151);
    assert_eq!(s.per_bin[0], 20);
    assert_eq!(s.bin_s, 1.0);
    assert!(s.render().contains("requests        151"));
}

#[test]
fn converted_traces_read_back_as_the_same_records() {
    let recs = [
        rec(0, Op::Read, 4096, 4096, 0),
        rec(1_000_000, Op::Write, 8192, 512, 3),
        rec(2_000_000_000, Op::Read, 1 << 30, 65536, 3),
    ];
    for f in [
        Format::Msr,
        Format::Umass,
        Format::Alibaba,
        Format::FioV3,
        Format::FioV2,
    ] {
        let mut out = Vec::new();
        let mut w = convert::Writer::new(&mut out, f).unwrap();
        for r in &recs {
            w.write(r).unwrap();
        }
        assert_eq!(w.finish().unwrap(), 3);
        let text = String::from_utf8(out).unwrap();
        let back = records(&text, f);
        let want: Vec<Record> = match f {
            // fio numbers its files from 0 in the order they appear.
            Format::FioV3 | Format::FioV2 => recs
                .iter()
                .map(|r| Record {
                    volume: u64::from(r.volume != 0),
                    ..*r
                })
                .collect(),
            _ => recs.to_vec(),
        };
        assert_eq!(back, want, "{}:\n{text}", f.name());
    }
    let mut out = Vec::new();
    let mut w = convert::Writer::new(&mut out, Format::Tencent).unwrap();
    assert!(
        w.write(&rec(0, Op::Read, 100, 4096, 0))
            .unwrap_err()
            .to_string()
            .contains("record 1: offset 100 is not whole 512 B sectors")
    );
    let mut w = convert::Writer::new(&mut out, Format::Msr).unwrap();
    assert!(
        w.write(&rec(0, Op::Trim, 0, 4096, 0))
            .unwrap_err()
            .to_string()
            .contains("reads and writes only")
    );
}

mod no_panic {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn any_bytes_give_records_or_line_numbered_errors(bytes in proptest::collection::vec(any::<u8>(), 0..400), f in 0usize..8) {
            let format = Format::ALL.get(f).copied();
            let input: Box<dyn BufRead + Send> = Box::new(Cursor::new(bytes));
            if let Ok(reader) = Reader::from_input(input, "p".into(), format, Select::default(), OnError::Stop) {
                for r in reader {
                    if let Err(e) = r {
                        prop_assert!(e.line > 0, "{e}");
                    }
                }
            }
        }

        #[test]
        fn csv_like_lines_never_panic(line in "[0-9RWrw,. +:a-z-]{0,80}", f in 0usize..7) {
            let text = format!("{line}\n{line}\n");
            let input: Box<dyn BufRead + Send> = Box::new(Cursor::new(text.into_bytes()));
            let reader = Reader::from_input(input, "p".into(), Some(Format::ALL[f]), Select::default(), OnError::Skip).unwrap();
            for r in reader {
                prop_assert!(r.is_ok());
            }
        }
    }
}
