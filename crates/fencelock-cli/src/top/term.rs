//! The terminal of `fencelock top`, with plain ANSI sequences and termios
//! (no terminal library): raw mode and the alternate screen for as long as a
//! [`Terminal`] lives, put back on every way out (its `Drop`, and a panic
//! hook that runs before the panic message is printed); the size from
//! `TIOCGWINSZ`; the keys read from stdin on a thread of their own; each
//! [`Frame`] painted in place (only the lines that changed), never
//! scrolling.

use std::io::{IsTerminal as _, Read as _, Write as _};
use std::sync::Mutex;

use nix::sys::termios::{self, SetArg, Termios};
use tokio::sync::mpsc;

use super::screen::Frame;
use super::state::Key;

/// Alternate screen on, cursor hidden, screen cleared.
const ENTER: &str = "\x1b[?1049h\x1b[?25l\x1b[2J\x1b[H";
/// Attributes reset, cursor shown, alternate screen off (the shell's
/// screen comes back as it was).
const LEAVE: &str = "\x1b[0m\x1b[?25h\x1b[?1049l";
/// The size used when the terminal does not say.
const FALLBACK: (usize, usize) = (80, 24);

/// The settings to put back, while the terminal is in raw mode.
static SAVED: Mutex<Option<Termios>> = Mutex::new(None);

/// Whether stdin and stdout are both a terminal.
pub fn is_terminal() -> bool {
    std::io::stdin().is_terminal() && std::io::stdout().is_terminal()
}

/// The terminal in raw mode on the alternate screen; put back on drop.
pub struct Terminal(());

impl Terminal {
    /// Raw mode (no echo, no line editing, no signals from keys: Ctrl-C is
    /// a key) and the alternate screen with the cursor hidden.
    pub fn enter() -> anyhow::Result<Terminal> {
        let stdin = std::io::stdin();
        let saved = termios::tcgetattr(&stdin)?;
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        *SAVED.lock().unwrap_or_else(|e| e.into_inner()) = Some(saved);
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore();
            hook(info);
        }));
        termios::tcsetattr(&stdin, SetArg::TCSAFLUSH, &raw)?;
        let guard = Terminal(());
        write_out(ENTER)?;
        Ok(guard)
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        restore();
    }
}

/// Put the terminal back as it was, once: the saved settings, the normal
/// screen, the cursor. Later calls do nothing.
fn restore() {
    let saved = SAVED.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(saved) = saved {
        let _ = write_out(LEAVE);
        let _ = termios::tcsetattr(std::io::stdin(), SetArg::TCSAFLUSH, &saved);
    }
}

fn write_out(s: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(s.as_bytes())?;
    out.flush()
}

nix::ioctl_read_bad!(window_size, nix::libc::TIOCGWINSZ, nix::pty::Winsize);

/// The terminal's (columns, rows), read now; 80×24 when it does not say.
pub fn size() -> (usize, usize) {
    use std::os::fd::AsRawFd as _;
    let mut ws = nix::pty::Winsize { ws_row: 0, ws_col: 0, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCGWINSZ writes one `winsize` (which `Winsize` is) into `ws`.
    match unsafe { window_size(std::io::stdout().as_raw_fd(), &mut ws) } {
        Ok(_) if ws.ws_col > 0 && ws.ws_row > 0 => (ws.ws_col.into(), ws.ws_row.into()),
        _ => FALLBACK,
    }
}

/// What the terminal shows now, so that a new frame sends only the lines
/// that changed (little to send over a slow SSH link, no flicker).
#[derive(Default)]
pub struct Screen {
    shown: Vec<String>,
    size: (usize, usize),
}

impl Screen {
    /// Paint `frame` on a `width`×`height` terminal.
    pub fn draw(&mut self, frame: &Frame, width: usize, height: usize) -> std::io::Result<()> {
        if self.size != (width, height) {
            self.shown.clear();
            self.size = (width, height);
        }
        write_out(&paint(frame, &self.shown, width, height))?;
        self.shown.clone_from(&frame.lines);
        Ok(())
    }
}

/// The bytes that turn the screen from `shown` (empty: unknown) to `frame`:
/// each changed line at its row (no newline, so the screen never scrolls),
/// the first in reverse video, the rest of a shorter line cleared, and the
/// rows below the frame when it has fewer lines than before; then the
/// cursor, shown where the frame puts it, else hidden. A full-width line is
/// not followed by "erase to end of line", which would erase its last
/// character.
fn paint(frame: &Frame, shown: &[String], width: usize, height: usize) -> String {
    let mut out = String::new();
    if shown.is_empty() {
        out.push_str("\x1b[2J");
    }
    for (row, line) in frame.lines.iter().enumerate() {
        if shown.get(row) == Some(line) {
            continue;
        }
        out.push_str(&format!("\x1b[{};1H", row + 1));
        if row == 0 {
            out.push_str("\x1b[7m");
        }
        out.push_str(line);
        if row == 0 {
            out.push_str("\x1b[0m");
        }
        if line.chars().count() < width {
            out.push_str("\x1b[K");
        }
    }
    if frame.lines.len() < height && frame.lines.len() < shown.len() {
        out.push_str(&format!("\x1b[{};1H\x1b[J", frame.lines.len() + 1));
    }
    match frame.cursor {
        Some((row, col)) => out.push_str(&format!("\x1b[{};{}H\x1b[?25h", row + 1, col + 1)),
        None => out.push_str("\x1b[?25l"),
    }
    out
}

/// Reads stdin on a thread of its own and hands on what each read got. The
/// channel closes when stdin ends (the terminal hung up); the thread ends
/// with the process, or at the next key after the receiver is gone.
pub fn read_keys() -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel(16);
    std::thread::spawn(move || {
        let mut buf = [0u8; 256];
        loop {
            match std::io::stdin().lock().read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if tx.blocking_send(buf[..n].to_vec()).is_err() {
                        return;
                    }
                }
            }
        }
    });
    rx
}

/// The keys in what one read got. An escape sequence (an arrow, a function
/// key: ESC `[` or `O`, then up to its final letter or `~`) is no key; an
/// ESC alone is Esc.
pub fn decode_keys(bytes: &[u8]) -> Vec<Key> {
    let text = String::from_utf8_lossy(bytes);
    let mut keys = Vec::new();
    let mut it = text.chars().peekable();
    while let Some(c) = it.next() {
        let key = match c {
            '\x1b' if matches!(it.peek(), Some('[' | 'O')) => {
                it.next();
                for c in it.by_ref() {
                    if c.is_ascii_alphabetic() || c == '~' {
                        break;
                    }
                }
                continue;
            }
            '\x1b' => Key::Esc,
            '\x03' => Key::CtrlC,
            '\r' | '\n' => Key::Enter,
            '\x7f' | '\x08' => Key::Backspace,
            c => Key::Char(c),
        };
        keys.push(key);
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rule: keys are read as a terminal in raw mode sends them: Enter as
    /// CR, Backspace as DEL or BS, Ctrl-C as ETX, a lone ESC as Esc, UTF-8
    /// as characters; arrows and function keys are skipped whole.
    #[test]
    fn keys_decode_from_raw_bytes() {
        use Key::*;
        assert_eq!(decode_keys(b"q"), [Char('q')]);
        assert_eq!(decode_keys(b"/jobs\r"), [Char('/'), Char('j'), Char('o'), Char('b'), Char('s'), Enter]);
        assert_eq!(decode_keys(b"\x7f\x08\x03\x1b"), [Backspace, Backspace, CtrlC, Esc]);
        assert_eq!(decode_keys(b"a\x1b[Ab\x1bOPc\x1b[15~d"), [Char('a'), Char('b'), Char('c'), Char('d')]);
        assert_eq!(decode_keys("é".as_bytes()), [Char('é')]);
    }

    /// Rule: a frame is painted in place: each changed line at its row,
    /// the header in reverse video, a shorter line's rest cleared (not a
    /// full-width line's: that would erase its last character), the rows a
    /// shorter frame leaves cleared, never a newline (no scrolling), the
    /// cursor hidden unless the frame places it.
    #[test]
    fn frames_paint_in_place_and_send_only_changes() {
        let frame = Frame { lines: vec!["head".into(), "abcd".into(), "ab".into()], cursor: None };
        let first = paint(&frame, &[], 4, 5);
        assert_eq!(first, "\x1b[2J\x1b[1;1H\x1b[7mhead\x1b[0m\x1b[2;1Habcd\x1b[3;1Hab\x1b[K\x1b[?25l");
        assert!(!first.contains('\n'), "no newline: the screen never scrolls");
        assert_eq!(paint(&frame, &frame.lines, 4, 5), "\x1b[?25l", "nothing changed, nothing sent");
        let shorter = Frame { lines: vec!["head".into(), "xy".into()], cursor: Some((2, 3)) };
        assert_eq!(paint(&shorter, &frame.lines, 4, 5), "\x1b[2;1Hxy\x1b[K\x1b[3;1H\x1b[J\x1b[3;4H\x1b[?25h");
    }
}
