// next/font/google fetches the app's font (Inter) from fonts.googleapis.com at build time; this
// machine may have no network but the package registry. Next.js reads mocked responses from the
// file named by NEXT_FONT_GOOGLE_MOCKED_RESPONSES (meant for its own tests): the stylesheet below
// declares Inter from a locally installed font, so the build needs no network and the app's
// source stays untouched. The browser falls back to its sans-serif font when Inter is absent.
const css = `
@font-face {
  font-family: 'Inter';
  font-style: normal;
  font-weight: 100 900;
  font-display: swap;
  src: local('Inter'), local('Inter Regular');
}
`;
const families = ["Inter:wght@100..900", "Inter"];
const urls = {};
for (const family of families) {
  for (const display of ["swap", "optional", "block", "fallback", "auto"]) {
    urls[`https://fonts.googleapis.com/css2?family=${family}&display=${display}`] = css;
  }
}
module.exports = urls;
