//! A minimal MC146818 CMOS: an index register and 128 bytes, the clock read from the host's
//! UTC time, register A never "update in progress" (Linux's rtc_cmos probe spins otherwise)
//! and register D "battery good".

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

const REG_A: usize = 0x0a;
const REG_B: usize = 0x0b;
const REG_D: usize = 0x0d;

#[derive(Debug, Clone)]
pub struct Cmos {
    index: u8,
    data: [u8; 128],
}

/// What a snapshot keeps of the CMOS.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CmosState {
    pub index: u8,
    pub data: Vec<u8>,
}

impl Default for Cmos {
    fn default() -> Self {
        Self::new()
    }
}

impl Cmos {
    pub fn new() -> Cmos {
        let mut data = [0u8; 128];
        data[REG_A] = 0x26; // 32.768 kHz time base, 1024 Hz rate, UIP clear
        data[REG_B] = 0x02; // 24-hour mode, BCD
        data[REG_D] = 0x80; // valid RAM and time
        Cmos { index: 0, data }
    }

    pub fn restore(state: &CmosState) -> Cmos {
        let mut cmos = Cmos::new();
        cmos.index = state.index & 0x7f;
        for (slot, byte) in cmos.data.iter_mut().zip(&state.data) {
            *slot = *byte;
        }
        cmos
    }

    pub fn state(&self) -> CmosState {
        CmosState {
            index: self.index,
            data: self.data.to_vec(),
        }
    }

    /// `offset` 0 is the index port (0x70), 1 the data port (0x71).
    pub fn read(&mut self, offset: u16) -> u8 {
        if offset == 0 {
            return self.index;
        }
        let index = usize::from(self.index & 0x7f);
        match clock_field(index) {
            Some(value) => value,
            None => self.data[index],
        }
    }

    pub fn write(&mut self, offset: u16, value: u8) {
        if offset == 0 {
            // Bit 7 is the NMI mask on real hardware; it selects nothing here.
            self.index = value & 0x7f;
            return;
        }
        let index = usize::from(self.index);
        // The clock registers and A's UIP and D are read-only here.
        if !matches!(index, 0x00..=0x09 | REG_D) {
            self.data[index] = if index == REG_A { value & 0x7f } else { value };
        }
    }
}

fn bcd(value: u64) -> u8 {
    let value = (value % 100) as u8;
    ((value / 10) << 4) | (value % 10)
}

/// The host's UTC time for clock register `index`, in BCD.
fn clock_field(index: usize) -> Option<u8> {
    if !matches!(index, 0 | 2 | 4 | 6 | 7 | 8 | 9 | 0x32) {
        return None;
    }
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let days = secs / 86_400;
    let (year, month, day) = civil_from_days(days);
    Some(match index {
        0 => bcd(secs % 60),
        2 => bcd(secs / 60 % 60),
        4 => bcd(secs / 3600 % 24),
        6 => bcd((days + 4) % 7 + 1), // 1970-01-01 was a Thursday; Sunday is 1
        7 => bcd(day),
        8 => bcd(month),
        9 => bcd(year % 100),
        _ => bcd(year / 100),
    })
}

/// Howard Hinnant's days-to-civil algorithm: (year, month, day) of a day count since 1970.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_civil_from_days_known_dates_match() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_788), (2026, 12, 1));
    }

    #[test]
    fn test_cmos_register_a_never_update_in_progress() {
        let mut cmos = Cmos::new();
        cmos.write(0, 0x0a);
        cmos.write(1, 0xff);
        assert_eq!(cmos.read(1) & 0x80, 0);
        cmos.write(0, 0x0d);
        assert_eq!(cmos.read(1), 0x80);
    }
}
