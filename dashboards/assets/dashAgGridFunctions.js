// Value formatters for sptrace's grids (dash-ag-grid looks functions up in this namespace).
// Cells keep their numbers, so sorting and filtering stay numeric; only the display is human.
var dagfuncs = (window.dashAgGridFunctions = window.dashAgGridFunctions || {});

dagfuncs.sptraceBytes = function (value) {
  if (value === null || value === undefined || value === "" || Number.isNaN(Number(value))) {
    return "";
  }
  var v = Number(value);
  var units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  var i = 0;
  var a = Math.abs(v);
  while (a >= 1024 && i < units.length - 1) {
    a /= 1024;
    v /= 1024;
    i += 1;
  }
  return i === 0 ? v.toFixed(0) + " B" : v.toFixed(2) + " " + units[i];
};

dagfuncs.sptraceNumber = function (value, digits) {
  if (value === null || value === undefined || value === "" || Number.isNaN(Number(value))) {
    return "";
  }
  return Number(value).toFixed(digits);
};
