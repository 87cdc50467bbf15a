//! One value per device, found by ordinal: the one shape behind every
//! "one X per device" handle (the allocator's `DeviceAllocators`, the stream
//! pool's `DevicePools`), so the ordinal check and its error are written once.

use crate::objects::context::Context;
use std::fmt;
use std::sync::Arc;

/// A device ordinal that a [`PerDevice`] holds no value for, or a context
/// given out of order when building one (device `ordinal` where device
/// `count` was due).
///
/// Each crate's own error converts from it, naming what it keeps per device.
///
/// ```
/// use cuda_streams_driver::{Context, PerDevice, UnknownDevice};
/// # fn main() -> cuda_streams_driver::Result<()> {
/// let per: PerDevice<i32> = PerDevice::try_new(&Context::all()?, |ctx| {
///     Ok::<_, UnknownDevice>(ctx.ordinal())
/// })
/// .unwrap();
/// let err = per.get(-1).unwrap_err();
/// assert_eq!(err, UnknownDevice { ordinal: -1, count: per.len() });
/// assert!(err.to_string().contains("device -1"), "{err}");
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[error("device {ordinal} has no value here: there are {count} device(s), from 0")]
pub struct UnknownDevice {
    /// The ordinal asked for (or given out of order).
    pub ordinal: i32,
    /// How many devices have a value (or had one when it was given).
    pub count: usize,
}

/// One `T` for each device, device 0 first, found by ordinal.
///
/// ```
/// use cuda_streams_driver::{Context, PerDevice, Stream, UnknownDevice};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let contexts = Context::all()?;
/// // A stream on every device.
/// let streams = PerDevice::try_new(&contexts, |ctx| {
///     Stream::new(ctx).map_err(Box::<dyn std::error::Error>::from)
/// })?;
/// assert_eq!(streams.len(), contexts.len());
/// let last = streams.len() as i32 - 1;
/// assert_eq!(streams.get(last)?.context().ordinal(), last);
/// assert!(streams.get(last + 1).is_err());
/// // Contexts must come as devices 0, 1, ... in order.
/// if contexts.len() > 1 {
///     let reversed: Vec<_> = contexts.iter().rev().cloned().collect();
///     let err = PerDevice::try_new(&reversed, |ctx| Ok::<_, UnknownDevice>(ctx.ordinal()));
///     assert_eq!(err.unwrap_err(), UnknownDevice { ordinal: last, count: 0 });
/// }
/// # Ok(())
/// # }
/// ```
pub struct PerDevice<T> {
    values: Vec<T>,
}

impl<T> PerDevice<T> {
    /// A value made by `make` for each of `contexts`, which must be devices
    /// 0, 1, ... in order (so that ordinals index them); the first out of
    /// order is [`UnknownDevice`], as is a failure of `make` its own error.
    pub fn try_new<E: From<UnknownDevice>>(
        contexts: &[Arc<Context>],
        mut make: impl FnMut(&Arc<Context>) -> Result<T, E>,
    ) -> Result<Self, E> {
        let values = contexts
            .iter()
            .enumerate()
            .map(|(index, ctx)| {
                if ctx.ordinal() != index as i32 {
                    return Err(UnknownDevice {
                        ordinal: ctx.ordinal(),
                        count: index,
                    }
                    .into());
                }
                make(ctx)
            })
            .collect::<Result<Vec<_>, E>>()?;
        Ok(Self { values })
    }

    /// The value of device `ordinal`, or [`UnknownDevice`] naming it.
    pub fn get(&self, ordinal: i32) -> Result<&T, UnknownDevice> {
        usize::try_from(ordinal)
            .ok()
            .and_then(|index| self.values.get(index))
            .ok_or(UnknownDevice {
                ordinal,
                count: self.values.len(),
            })
    }

    /// How many devices have a value.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether no device has one (built from no contexts).
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The values, device 0 first.
    pub fn iter(&self) -> std::slice::Iter<'_, T> {
        self.values.iter()
    }
}

impl<'a, T> IntoIterator for &'a PerDevice<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<T> fmt::Debug for PerDevice<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PerDevice")
            .field("devices", &self.values.len())
            .finish()
    }
}
